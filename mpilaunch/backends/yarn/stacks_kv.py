"""`mpilaunch stacks NAME --backend yarn` for a job no mpilaunch on this machine runs: its launcher asks.

The workers' agents take only the job's secret, which only the launcher
container holds (it leaves skein's key-value store once read), and YARN has
no exec channel of its own. So the launcher container takes the stacks
itself, with the channel it runs mpirun through, and hands them over in the
application's key-value store, which only the application's owner reaches
(skein's mutual TLS with the application's own credentials):

1. ``mpilaunch stacks`` puts ``<kv>launcher/stacks/request/<id>`` (the
   request's id and ``--deadline``) and polls for the reply,
   ``<kv>launcher/stacks/reply/<id>``, which it takes (deletes) once it is
   there; it gives up after ``--deadline`` plus ``REPLY_MARGIN_S`` and
   deletes its request.
2. The launcher container (``serve``, a daemon thread; it waits on the
   store's events, no polling) takes each request out of the store, collects
   the stacks through its own context file (``hang.collect``, as its hang
   diagnosis at ``--timeout`` does) and puts the reply: every rank's
   ``RankStack`` as JSON, or an error line.

A reply stays well under gRPC's 4 MB message limit (``MAX_REPLY_BYTES``): the
texts of a frame are capped, and where the whole is still too big every rank
keeps only its innermost frames, the same number for all (``encode_reply``).
The encode/decode functions are pure.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import replace

from ...hang.verdict import RankStack
from .keys import STACKS_REPLY_KEY, STACKS_REQUEST_KEY

#: what the client waits for a reply beyond the collection's own deadline (the launcher's turn
#: to read the request, a request of someone else's answered first, the reply's way back)
REPLY_MARGIN_S = 10.0
POLL_S = 0.2
#: the deadline a launcher grants one collection, whatever was asked
MIN_DEADLINE_S, MAX_DEADLINE_S = 1.0, 120.0
#: a reply's size at most: far below gRPC's 4 MB, and little for the ApplicationMaster's 128 MB heap
MAX_REPLY_BYTES = 1_000_000
#: the innermost frames each rank keeps, tried in this order until the reply fits
FRAME_CAPS = (None, 64, 32, 16, 8, 4, 2, 1, 0)
#: per frame (and per rank's note): the longest texts kept
TEXT_CAPS = {"function": 200, "code": 200, "file": 500, "note": 300}
#: a reply nobody took (its asker gave up) is removed after this long
REPLY_KEEP_S = 120.0

_ID = re.compile(r"[0-9a-f]{32}")


class NoReply(Exception):
    """The launcher did not answer within the time asked."""


class ReplyError(Exception):
    """The launcher answered with an error (the ranks not started yet, the collection failed)."""


# ------------------------------------------------------------------ keys and requests (pure)


def new_request_id() -> str:
    return uuid.uuid4().hex


def request_key(prefix: str, request_id: str) -> str:
    return f"{prefix}{STACKS_REQUEST_KEY}{request_id}"


def reply_key(prefix: str, request_id: str) -> str:
    return f"{prefix}{STACKS_REPLY_KEY}{request_id}"


def request_id_of(prefix: str, key: str) -> str | None:
    """The request id in a request key; None for any other key (or a malformed id)."""
    head = prefix + STACKS_REQUEST_KEY
    if not key.startswith(head):
        return None
    request_id = key[len(head) :]
    return request_id if _ID.fullmatch(request_id) else None


def encode_request(request_id: str, deadline_s: float) -> bytes:
    return json.dumps({"id": request_id, "deadline_s": float(deadline_s)}).encode()


def decode_request(raw: bytes, request_id: str) -> float:
    """The collection deadline a request asks for, within [MIN_DEADLINE_S, MAX_DEADLINE_S];
    ValueError for a request that is not one (not JSON, another id)."""
    data = json.loads(raw.decode())
    if not isinstance(data, dict) or data.get("id") != request_id:
        raise ValueError(f"not a stacks request for {request_id}")
    try:
        deadline_s = float(data.get("deadline_s") or 0.0)
    except (TypeError, ValueError):
        deadline_s = math.nan
    if math.isnan(deadline_s):
        raise ValueError("the request's deadline is no number")
    return min(MAX_DEADLINE_S, max(MIN_DEADLINE_S, deadline_s))


# ------------------------------------------------------------------ replies (pure)


def _cap(text: str, limit: int, keep_tail: bool = False) -> str:
    if len(text) <= limit:
        return text
    return "..." + text[-(limit - 3) :] if keep_tail else text[: limit - 3] + "..."


def trimmed(stack: RankStack, frames: int | None) -> RankStack:
    """``stack`` with capped texts and, where ``frames`` is a number, only that many innermost frames
    (a file keeps its end: its name is what the verdict shows)."""
    kept = stack.frames if frames is None else stack.frames[:frames]
    return replace(
        stack,
        frames=tuple(
            replace(
                f,
                function=_cap(f.function, TEXT_CAPS["function"]),
                code=_cap(f.code, TEXT_CAPS["code"]),
                file=_cap(f.file, TEXT_CAPS["file"], keep_tail=True),
            )
            for f in kept
        ),
        note=_cap(stack.note, TEXT_CAPS["note"]),
    )


def encode_reply(request_id: str, stacks, seconds: float, limit: int = MAX_REPLY_BYTES) -> bytes:
    """Every rank's stacks as the reply to ``request_id``, at most ``limit`` bytes: the fewest
    frames cut that make it fit (the same cap for every rank, so equal stacks stay equal), and an
    error reply where not even the ranks alone fit."""
    stacks = list(stacks)
    for cap in FRAME_CAPS:
        data = {
            "id": request_id,
            "seconds": round(float(seconds), 3),
            "stacks": [trimmed(s, cap).to_dict() for s in stacks],
        }
        if cap is not None and any(len(s.frames) > cap for s in stacks):
            data["frames_kept"] = cap
        raw = json.dumps(data, separators=(",", ":")).encode()
        if len(raw) <= limit:
            return raw
    return encode_error(request_id, f"{len(stacks)} ranks' stacks do not fit in a reply of {limit} bytes")


def encode_error(request_id: str, error: str) -> bytes:
    return json.dumps({"id": request_id, "error": _cap(" ".join(error.split()), 500)}).encode()


def decode_reply(raw: bytes, request_id: str) -> tuple[list[RankStack], float]:
    """(every rank's stacks, the seconds their collection took) from a reply; ReplyError for the
    launcher's error, ValueError for a reply that is not one."""
    data = json.loads(raw.decode())
    if not isinstance(data, dict) or data.get("id") != request_id:
        raise ValueError(f"not a stacks reply for {request_id}")
    if data.get("error"):
        raise ReplyError(str(data["error"]))
    try:
        return [RankStack.from_dict(s) for s in data.get("stacks") or ()], float(data.get("seconds") or 0.0)
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"a malformed stacks reply: {e!r}") from None


# ------------------------------------------------------------------ the asking side


def ask(kv, prefix: str, deadline_s: float, wait_s: float | None = None) -> tuple[list[RankStack], float]:
    """Ask the launcher for every rank's stacks (collected within ``deadline_s``) and wait at most
    ``wait_s`` (default: ``deadline_s`` + ``REPLY_MARGIN_S``) for its reply. Neither key stays
    behind. NoReply when none came, ReplyError when the launcher could not take them."""
    request_id = new_request_id()
    wait_s = deadline_s + REPLY_MARGIN_S if wait_s is None else wait_s
    asked, answer = request_key(prefix, request_id), reply_key(prefix, request_id)
    kv[asked] = encode_request(request_id, deadline_s)
    raw = None
    try:
        give_up = time.monotonic() + wait_s
        while True:
            raw = kv.pop(answer)
            if raw is not None:
                return decode_reply(raw, request_id)
            if time.monotonic() >= give_up:
                raise NoReply(f"no reply within {wait_s:.0f} s")
            time.sleep(POLL_S)
    finally:
        try:
            kv.discard(asked)  # not taken yet: nobody is to answer it any more
            if raw is None:
                kv.discard(answer)  # put since the last look
        except Exception:
            pass  # the application ended meanwhile: its store went with it


# ------------------------------------------------------------------ the launcher's side


def serve(kv, prefix: str, take_stacks, note=lambda message: None) -> None:
    """Answer every stacks request put under ``prefix`` (those already there first), one at a time,
    until the store goes away (the application ends). ``take_stacks(deadline_s)`` -> a
    ``hang.collect.Collection``; what it raises is the error reply."""
    written: dict[str, float] = {}  # reply key -> when it was put
    try:
        with kv.events(prefix=prefix + STACKS_REQUEST_KEY, event_type="put") as queue:
            keys = list(kv.list_keys(prefix=prefix + STACKS_REQUEST_KEY))
            while True:
                for key in keys:
                    answer(kv, prefix, key, take_stacks, written)
                keys = [queue.get().key]
    except Exception as e:  # the application ended, or its ApplicationMaster went away
        note(f"stacks requests are no longer answered: {e!r}")


def answer(kv, prefix: str, key: str, take_stacks, written: dict[str, float]) -> None:
    """One request: taken out of the store (a second look finds nothing), answered under its id."""
    request_id = request_id_of(prefix, key)
    raw = kv.pop(key)
    if request_id is None or raw is None:
        return
    try:
        deadline_s = decode_request(raw, request_id)
    except ValueError:
        return  # not ours to answer
    try:
        collection = take_stacks(deadline_s)
        reply = encode_reply(request_id, collection.stacks, collection.seconds)
    except Exception as e:
        reply = encode_error(request_id, str(e) or type(e).__name__)
    now = time.monotonic()
    for old, put_at in list(written.items()):
        if now - put_at > REPLY_KEEP_S:  # its asker gave up: no one will take it
            kv.discard(old)
            del written[old]
    kv[reply_key(prefix, request_id)] = reply
    written[reply_key(prefix, request_id)] = now


def stacks_taker(context_file, expected: dict[int, str] | None = None):
    """``take_stacks`` for ``serve``: through the context file the launcher's lifecycle writes once
    the workers are ready (``lifecycle.write_context``: the agents, the secret file, the probe's
    Python), as its own hang diagnosis does."""

    def take_stacks(deadline_s: float):
        from ...hang import collect

        try:
            context = json.loads(context_file.read_text())
        except (OSError, ValueError):
            raise ReplyError(
                "the job's ranks are not running: mpirun has not started them yet, or they ended"
            ) from None
        python = context.get("probe_python") or "python3"
        return collect.collect_from_context(context, python, expected=expected, deadline_s=deadline_s)

    return take_stacks
