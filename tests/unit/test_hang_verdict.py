"""The hang verdict (mpilaunch/hang/verdict.py): groups of identical stacks, the odd rank out, one line."""

import json

import pytest

from mpilaunch.hang import verdict as v
from mpilaunch.hang.verdict import EXITED, NATIVE, NOT_FOUND, PYTHON, RUNNING, STOPPED, UNREACHABLE, Frame, RankStack

SITE = "/venv/lib/python3.11/site-packages"


def allreduce_stack(rank, worker, inner="opal_progress", line=41):
    """What py-spy --native shows for a rank waiting in mpi4py's allreduce (innermost first)."""
    return RankStack(
        rank,
        worker,
        RUNNING,
        (
            Frame(inner, "/usr/lib/libopen-pal.so.40", 0, NATIVE),
            Frame("ompi_coll_base_allreduce_intra_recursivedoubling", "/usr/lib/libmpi.so.40", 0, NATIVE),
            Frame("PMPI_Allreduce", "/usr/lib/libmpi.so.40", 0, NATIVE),
            Frame("__pyx_f_6mpi4py_3MPI_PyMPI_allreduce", f"{SITE}/mpi4py/MPI.cpython-311.so", 0, NATIVE),
            Frame("_PyEval_EvalFrameDefault", "/usr/lib/libpython3.11.so", 0, NATIVE),
            Frame("step", "/home/u/train.py", line, PYTHON, "total = comm.allreduce(x)"),
            Frame("<module>", "/home/u/train.py", 60, PYTHON, "step()"),
        ),
    )


def sleeping_stack(rank, worker, line=12):
    return RankStack(
        rank,
        worker,
        RUNNING,
        (
            Frame("step", "/home/u/train.py", line, PYTHON, "    time.sleep(600)"),
            Frame("<module>", "/home/u/train.py", 60, PYTHON, "step()"),
        ),
    )


def eight_ranks_one_sleeping(sleeper=2):
    return [
        sleeping_stack(r, f"worker-{r // 4}")
        if r == sleeper
        else allreduce_stack(r, f"worker-{r // 4}", inner=("opal_progress", "poll", "epoll_wait")[r % 3])
        for r in range(8)
    ]


def test_hang_verdict_names_the_sleeping_rank_its_worker_and_where_the_others_wait():
    d = v.diagnose(eight_ranks_one_sleeping(sleeper=2))
    assert d.verdict == (
        "mpilaunch: hang: rank 2 (worker-0) is in time.sleep at train.py:12; "
        "the 7 other ranks are in MPI_Allreduce at train.py:41"
    )
    assert [g.ranks for g in d.odd] == [[2]]


@pytest.mark.parametrize("sleeper", [0, 5, 7])
def test_hang_verdict_names_whichever_rank_is_odd(sleeper):
    d = v.diagnose(eight_ranks_one_sleeping(sleeper))
    assert d.verdict.startswith(f"mpilaunch: hang: rank {sleeper} (worker-{sleeper // 4}) is in time.sleep")
    assert d.to_dict()["odd_ranks"] == [sleeper]


def test_hang_groups_ignore_the_native_frames_inside_the_mpi_call():
    # the progress loop's innermost frames differ between samples; the ranks still wait in one place
    groups = v.group_stacks(eight_ranks_one_sleeping(sleeper=2))
    assert [g.ranks for g in groups] == [[0, 1, 3, 4, 5, 6, 7], [2]]
    assert groups[0].line() == ("ranks 0-1,3-7: MPI_Allreduce <- step (train.py:41) <- <module> (train.py:60)")


def test_hang_groups_split_on_another_line_of_the_program():
    stacks = [allreduce_stack(r, "w0", line=41) for r in range(3)] + [allreduce_stack(3, "w1", line=44)]
    d = v.diagnose(stacks)
    assert [g.ranks for g in d.groups] == [[0, 1, 2], [3]]
    assert d.verdict == (
        "mpilaunch: hang: rank 3 (w1) is in MPI_Allreduce at train.py:44; "
        "the 3 other ranks are in MPI_Allreduce at train.py:41"
    )


def test_hang_stopped_rank_is_named_stopped_even_where_its_stack_matches():
    stacks = [allreduce_stack(r, "w0") for r in range(4)]
    stacks[1] = RankStack(1, "w0", STOPPED, stacks[1].frames)
    d = v.diagnose(stacks)
    assert d.verdict == (
        "mpilaunch: hang: rank 1 (w0) is stopped (state T) in MPI_Allreduce at train.py:41; "
        "the 3 other ranks are in MPI_Allreduce at train.py:41"
    )


def test_hang_exited_rank_is_named_with_its_code():
    stacks = [allreduce_stack(r, "w0") for r in range(3)] + [RankStack(3, "w1", EXITED, exit_code=3)]
    assert v.diagnose(stacks).verdict == (
        "mpilaunch: hang: rank 3 (w1) is exited with code 3; the 3 other ranks are in MPI_Allreduce at train.py:41"
    )


def test_hang_unreachable_worker_is_named_with_the_reason():
    stacks = [allreduce_stack(r, "w0") for r in range(2)] + [
        RankStack(r, "w1", UNREACHABLE, note="no answer within 15 s") for r in (2, 3)
    ]
    d = v.diagnose(stacks)
    assert d.verdict.startswith("mpilaunch: hang: ranks 2-3 (w1) are unreachable (no answer within 15 s); ")


def test_hang_no_rank_stands_out_when_all_wait_in_one_place():
    d = v.diagnose([allreduce_stack(r, "w0") for r in range(4)])
    assert d.odd == []
    assert d.verdict == ("mpilaunch: hang: no rank stands out: every rank (0-3) is in MPI_Allreduce at train.py:41")


def test_hang_no_majority_shows_the_largest_groups():
    stacks = [allreduce_stack(r, "w0", line=41) for r in range(2)] + [
        allreduce_stack(r, "w1", line=44) for r in range(2, 4)
    ]
    d = v.diagnose(stacks)
    assert d.odd == []
    assert d.verdict == (
        "mpilaunch: hang: no rank stands out; the largest groups: ranks 0-1 in MPI_Allreduce "
        "at train.py:41; ranks 2-3 in MPI_Allreduce at train.py:44"
    )


def test_hang_two_ranks_the_one_outside_mpi_stands_out():
    d = v.diagnose([allreduce_stack(0, "w0"), sleeping_stack(1, "w1")])
    assert d.to_dict()["odd_ranks"] == [1]


def test_hang_user_frame_skips_stdlib_site_packages_and_mpilaunch():
    frames = (
        Frame("wait", "/usr/lib/python3.11/threading.py", 320, PYTHON, "waiter.acquire()"),
        Frame("get", f"{SITE}/somelib/queue.py", 10, PYTHON, "self.cond.wait()"),
        Frame("main", "/opt/mpilaunch/rank.py", 5, PYTHON),
        Frame("load", "/data/job/loader.py", 77, PYTHON, "batch = q.get()"),
    )
    assert v.where(frames) == "loader.py:77"
    # the innermost function is where the rank is, even in the standard library
    assert v.innermost_function(frames) == "wait"


def test_hang_innermost_function_prefers_the_mpi_call_then_the_source_call():
    assert v.innermost_function(allreduce_stack(0, "w").frames) == "MPI_Allreduce"
    assert v.innermost_function(sleeping_stack(0, "w").frames) == "time.sleep"
    busy = (Frame("spin", "/home/u/busy.py", 5, PYTHON, "while True: x += 1  # see busy(note)"),)
    assert v.innermost_function(busy) == "spin"
    native_only = (Frame("nanosleep", "libc.so.6", 0, NATIVE), Frame("main", "a.out", 0, NATIVE))
    assert v.innermost_function(native_only) == "nanosleep"
    recv = (Frame("poll", "libc", 0, NATIVE), Frame("PMPI_Recv", "libmpi", 0, NATIVE), Frame("main", "a", 0, NATIVE))
    assert v.innermost_function(recv) == "MPI_Recv"
    large_count = (Frame("MPIDI_progress_test", "libmpich", 0, NATIVE), Frame("PMPI_Recv_c", "libmpich", 0, NATIVE))
    assert v.innermost_function(large_count) == "MPI_Recv"


HVD = f"{SITE}/horovod/torch"


def horovod_stack(rank, worker, line, tensor):
    """py-spy --native of a Horovod (PyTorch) rank's main thread waiting for an allreduce: Horovod's
    background thread does the MPI, the main thread waits in synchronize (as the real dump shows)."""
    return RankStack(
        rank,
        worker,
        RUNNING,
        (
            Frame("sched_yield", "/usr/lib/x86_64-linux-gnu/libc.so.6", 0, NATIVE),
            Frame("horovod::torch::WaitAndClear", f"{HVD}/mpi_lib_v2.cpython-311-x86_64-linux-gnu.so", 0, NATIVE),
            Frame("synchronize", f"{HVD}/mpi_ops.py", 1285, PYTHON, "mpi_lib.horovod_torch_wait_and_clear(handle)"),
            Frame("HorovodAllreduce.forward", f"{HVD}/mpi_ops.py", 205, PYTHON, "return synchronize(handle)"),
            Frame("THPFunction_apply", "/usr/lib/x86_64-linux-gnu/libtorch_python.so.1.13.0", 0, NATIVE),
            Frame("allreduce", f"{HVD}/mpi_ops.py", 254, PYTHON, "summed = HorovodAllreduce.apply(tensor, ...)"),
            Frame("<module>", "/home/u/train.py", line, PYTHON, f'hvd.allreduce(torch.ones(4), name="{tensor}")'),
            Frame("0x7f8676f0b24a", "/usr/lib/x86_64-linux-gnu/libc.so.6", 0, NATIVE),
        ),
    )


def test_hang_horovod_rank_that_skipped_a_tensor_is_named_with_the_users_call():
    # every main thread waits in Horovod's synchronize; the odd rank on another line (another tensor)
    stacks = [horovod_stack(r, f"w{r // 2}", 29, "grad_a") for r in (0, 1, 3)] + [horovod_stack(2, "w1", 30, "grad_b")]
    d = v.diagnose(stacks)
    assert d.verdict == (
        "mpilaunch: hang: rank 2 (w1) is in synchronize via hvd.allreduce at train.py:30; "
        "the 3 other ranks are in synchronize via hvd.allreduce at train.py:29"
    )
    assert d.to_dict()["odd_ranks"] == [2]


def test_hang_torch_gloo_call_is_not_repeated_when_the_library_function_has_its_name():
    c10d = "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py"
    waiting = (
        Frame("pthread_cond_wait", "libc.so.6", 0, NATIVE),
        Frame("c10d::Work::wait", "libtorch", 0, NATIVE),
        Frame("all_reduce", c10d, 1541, PYTHON, "work.wait()"),
        Frame("<module>", "/home/u/train.py", 25, PYTHON, "dist.all_reduce(t)"),
    )
    assert v.place_function(waiting) == "all_reduce"
    # a framework deep below the user's line: where it is, and the call the user wrote
    loader = (
        Frame("_next_data", f"{SITE}/torch/utils/data/dataloader.py", 9, PYTHON, "idx = self._next_index()"),
        Frame("fit", f"{SITE}/lightning/trainer.py", 3, PYTHON, "self._run()"),
        Frame("<module>", "/home/u/train.py", 50, PYTHON, "trainer.fit(model)  # train"),
    )
    assert v.place_function(loader) == "_next_data via trainer.fit"
    # the user's own innermost frame, or an MPI call: the innermost function alone
    assert v.place_function(sleeping_stack(0, "w").frames) == "time.sleep"
    assert v.place_function(allreduce_stack(0, "w").frames) == "MPI_Allreduce"


def test_hang_a_rank_without_frames_is_placed_as_unknown_with_the_reason():
    stacks = [allreduce_stack(r, "w0") for r in range(3)] + [RankStack(3, "w1", RUNNING, note="py-spy: refused")]
    assert v.diagnose(stacks).verdict.startswith(
        "mpilaunch: hang: rank 3 (w1) is in an unknown place (py-spy: refused); the 3 other ranks"
    )


def test_hang_several_odd_groups_are_each_named():
    stacks = [allreduce_stack(r, "w0") for r in range(6)]
    stacks[1] = sleeping_stack(1, "w0")
    stacks[4] = RankStack(4, "w1", NOT_FOUND)
    d = v.diagnose(stacks)
    assert d.verdict == (
        "mpilaunch: hang: rank 4 (w1) is not found on its worker; rank 1 (w0) is in time.sleep "
        "at train.py:12; the 4 other ranks are in MPI_Allreduce at train.py:41"
    )


def test_hang_report_round_trips_through_json():
    stacks = eight_ranks_one_sleeping(sleeper=6)
    out = json.loads(json.dumps(v.report(v.diagnose(stacks), collection_s=0.4321)))
    assert out["hang"]["odd_ranks"] == [6] and out["hang"]["collection_s"] == 0.432
    assert out["hang"]["verdict"].startswith("mpilaunch: hang: rank 6 ")
    back = [RankStack.from_dict(d) for d in out["stacks"]]
    assert back == sorted(stacks, key=lambda s: s.rank)
    assert v.diagnose(back).verdict == out["hang"]["verdict"]


def test_hang_lines_list_every_group_then_the_verdict():
    lines = v.diagnose(eight_ranks_one_sleeping(sleeper=2)).lines()
    assert lines[0].startswith("ranks 0-1,3-7: MPI_Allreduce <- ")
    assert lines[1] == "rank 2: time.sleep <- step (train.py:12) <- <module> (train.py:60)"
    assert lines[-1].startswith("mpilaunch: hang: rank 2 ")


def test_hang_nothing_collected():
    assert v.diagnose([]).verdict == "mpilaunch: hang: no rank's stacks could be taken"


def test_hang_groups_ignore_unnamed_native_frames_and_mpi4py_internals():
    def rank(r, address):
        return RankStack(
            r,
            "w0",
            RUNNING,
            (
                Frame("poll", "libc.so.6", 0, NATIVE),
                Frame("PMPI_Comm_dup", "libmpi.so.40", 0, NATIVE),
                Frame("MPI_PyMPI_Commctx_INTRA", f"{SITE}/mpi4py/MPI.so", 0, NATIVE),
                Frame("<module>", "/home/u/train.py", 46, PYTHON, "comm.allreduce(rank)"),
                Frame(address, "libc.so.6", 0, NATIVE),  # __libc_start_call_main, at another address per process
            ),
        )

    groups = v.group_stacks([rank(0, "0x7f26bfc4524a"), rank(1, "0x7f99f844524a")])
    assert [g.ranks for g in groups] == [[0, 1]]
    assert groups[0].function == "MPI_Comm_dup"


# ---------------------------------------------------------------- the stall clock (hang/stall.py)

from mpilaunch.hang import stall  # noqa: E402


def test_hang_stall_clock_needs_silence_and_unchanged_stacks():
    clock = stall.StallClock(9.0)
    same = stall.coarse_signature(eight_ranks_one_sleeping(2))
    assert not clock.should_sample(now=102.0, last_output=100.0)
    assert clock.should_sample(now=103.0, last_output=100.0)
    assert not clock.observe(103.0, 100.0, same)
    assert not clock.observe(106.0, 100.0, same)
    assert clock.observe(109.0, 100.0, same)


def test_hang_stall_clock_starts_over_on_output_or_a_changed_stack():
    clock = stall.StallClock(9.0)
    same = stall.coarse_signature(eight_ranks_one_sleeping(2))
    moved = stall.coarse_signature(eight_ranks_one_sleeping(3))
    assert not clock.observe(103.0, 100.0, same)
    assert not clock.observe(106.0, 100.0, moved)  # rank 3 moved: a new first sample
    assert not clock.observe(109.0, 100.0, moved)
    assert clock.observe(112.0, 100.0, moved)
    clock = stall.StallClock(9.0)
    clock.observe(103.0, 100.0, same)
    clock.observe(106.0, 100.0, same)
    assert not clock.observe(109.0, 107.0, same)  # a line at 107: the silence starts again


def test_hang_stall_signature_ignores_the_line_of_a_spinning_rank():
    def spinning(line):
        return [RankStack(0, "w", RUNNING, (Frame("spin", "/u/busy.py", line, PYTHON, "x += 1"),))]

    assert stall.coarse_signature(spinning(29)) == stall.coarse_signature(spinning(30))


def test_hang_stall_signature_ignores_whether_a_sample_got_native_frames():
    # the probe's native round may miss a rank in one sample (a loaded host) and not in the next
    full = eight_ranks_one_sleeping(2)
    python_only = [RankStack(s.rank, s.worker, s.state, tuple(f for f in s.frames if f.kind == PYTHON)) for s in full]
    assert stall.coarse_signature(full) == stall.coarse_signature(python_only)
    # a native-only rank (no Python frames) still counts by its innermost function
    native = [RankStack(0, "w", RUNNING, (Frame("nanosleep", "libc", 0, NATIVE),))]
    moved = [RankStack(0, "w", RUNNING, (Frame("MPI_Recv", "libmpi", 0, NATIVE),))]
    assert stall.coarse_signature(native) != stall.coarse_signature(moved)


def test_hang_a_program_shipped_in_the_image_is_the_users_code():
    """The project image holds tests/programs and examples under /opt/mpilaunch: user code, unlike
    the package beside them."""
    assert v.is_user_file("/opt/mpilaunch/tests/programs/hang.py")
    assert v.is_user_file("/opt/mpilaunch/examples/train.py")
    assert not v.is_user_file("/opt/mpilaunch/mpilaunch/rank.py")


def test_hang_stall_clock_a_rank_a_sample_could_not_read_does_not_start_it_over():
    clock = stall.StallClock(9.0)
    full = eight_ranks_one_sleeping(2)
    blind = list(full)
    blind[5] = RankStack(5, "worker-1", RUNNING, note="py-spy: TimeoutExpired")  # py-spy failed on rank 5
    assert not clock.observe(103.0, 100.0, stall.coarse_signature(full))
    assert not clock.observe(106.0, 100.0, stall.coarse_signature(blind))
    assert clock.observe(109.0, 100.0, stall.coarse_signature(full))
    # a rank that did move still starts it over, unknown ranks or not
    clock = stall.StallClock(9.0)
    clock.observe(103.0, 100.0, stall.coarse_signature(blind))
    clock.observe(106.0, 100.0, stall.coarse_signature(blind))
    assert not clock.observe(109.0, 100.0, stall.coarse_signature(eight_ranks_one_sleeping(3)))
    # a sample that read no rank at all (every worker unreachable) shows nothing: no hang from it
    nothing = [RankStack(r, "w", UNREACHABLE, note="no answer") for r in range(8)]
    clock = stall.StallClock(9.0)
    assert not any(clock.observe(t, 100.0, stall.coarse_signature(nothing)) for t in (103.0, 106.0, 109.0, 112.0))


def test_ranks_whose_native_frames_could_not_be_read_join_their_barrier():
    """Seen in a full suite run under load: py-spy's --native failed for ranks 0 and 1, so they were
    "in comm.Barrier" and rank 3 "in MPI_Barrier", and no group held a majority: no rank stood out
    though rank 2 alone was in MPI_Recv. Same Python lines, same MPI call: one group."""
    from mpilaunch.hang.verdict import NATIVE, PYTHON, RUNNING, Frame, RankStack, diagnose

    barrier_line = Frame("main", "/job/hang.py", 47, PYTHON, code="comm.Barrier()")
    recv_line = Frame("main", "/job/hang.py", 45, PYTHON, code="comm.Recv(buf, source=3)")
    stacks = [
        RankStack(0, "w-0", RUNNING, (barrier_line,)),
        RankStack(1, "w-0", RUNNING, (barrier_line,)),
        RankStack(2, "w-1", RUNNING, (Frame("PMPI_Recv", kind=NATIVE), recv_line)),
        RankStack(3, "w-1", RUNNING, (Frame("PMPI_Barrier", kind=NATIVE), barrier_line)),
    ]
    found = diagnose(stacks)
    assert [g.ranks for g in found.groups] == [[0, 1, 3], [2]]
    assert found.verdict.startswith("mpilaunch: hang: rank 2 (w-1) is in MPI_Recv at hang.py:45; "), found.verdict
