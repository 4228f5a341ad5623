"""A small tf_cnn_benchmarks-style TensorFlow + Horovod benchmark (synthetic data, CPU-sized ResNet).

    mpilaunch --np 4 --slots-per-worker 2 -- python examples/tf_cnn_benchmark.py --variable_update=horovod
    python examples/tf_cnn_benchmark.py --variable_update=independent      # one process, no Horovod

Our own program in the spirit of tensorflow/benchmarks' scripts/tf_cnn_benchmarks
(which needs TF 1.x-era APIs and GPUs to be useful): TF graph mode through
``tf.compat.v1``, ``horovod.tensorflow`` (``hvd.DistributedOptimizer``,
``hvd.broadcast_global_variables(0)``), synthetic CIFAR-10- or ImageNet-shaped
data and a CIFAR-style ResNet (depth 6n+2: resnet8/14/20/32) that a CPU can run.
Its flags and output follow tf_cnn_benchmarks, so scripts that read that output
(``total images/sec: N``) keep working: rank 0 prints the header, a
``Step\\tImg/sec\\ttotal_loss`` line every --display_every steps (rank 0's own
rate, as tf_cnn_benchmarks does under Horovod) and ``total images/sec``: the
sum of every rank's rate, i.e. the job's global rate.

For tests:
- ``--verify_replicas``: after the run every rank checksums its trainable
  variables (float64 sum, sha256 of the bytes), allgathers the checksums and
  prints ``TFHVD {json}``: identical (every rank ends with the same weights),
  moved (they differ from the values right after the broadcast), Horovod's view
  of the job and which controller ran. The exit status is 1 if either is false.
- ``TFHVD_FAIL_RANK=R`` (with ``TFHVD_FAIL_CODE``, default 43): rank R exits
  with that code right after its first training step, while the others wait in
  the next allreduce: what a rank dying inside a TensorFlow Horovod job looks like.

Controllers (``--controller``): ``mpi`` (default): Horovod picks its controller
from its own environment, which is MPI when mpirun started the ranks (and Gloo
under ``horovodrun --gloo``, which sets HOROVOD_* itself); ``gloo`` (or
``--gloo``): Horovod's Gloo controller and collectives with mpirun only
launching the ranks, the rendezvous built from the RANK/WORLD_SIZE/LOCAL_RANK/
LOCAL_WORLD_SIZE/NODE_RANK/MASTER_ADDR/MASTER_PORT variables mpilaunch's rank
wrapper sets (as tests/programs/horovod_allreduce.py --gloo does). The TFHVD
line says which controller really ran.
"""

import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time

# Quieter TensorFlow start-up (must be set before the import).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
DATASETS = {  # name: (image size, classes, training images per epoch)
    "cifar10": (32, 10, 50000),
    "imagenet": (224, 1000, 1281167),
}
MODELS = {"resnet8": 1, "resnet14": 2, "resnet20": 3, "resnet32": 5}  # name: blocks per stage (depth 6n+2)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="resnet20")
    p.add_argument("--data_name", choices=sorted(DATASETS), default="cifar10")
    p.add_argument("--batch_size", type=int, default=32, help="images per rank and step")
    p.add_argument("--num_batches", type=int, default=100, help="timed steps")
    p.add_argument("--num_warmup_batches", type=int, default=None, help="untimed steps first (default: 1-10)")
    p.add_argument("--display_every", type=int, default=10)
    p.add_argument("--variable_update", choices=["horovod", "independent"], default="horovod")
    p.add_argument("--optimizer", choices=["sgd", "momentum"], default="sgd")
    p.add_argument("--init_learning_rate", type=float, default=0.01)
    p.add_argument("--weight_decay", type=float, default=4e-5)
    p.add_argument("--num_intra_threads", type=int, default=0, help="0: TensorFlow's default")
    p.add_argument("--num_inter_threads", type=int, default=0, help="0: TensorFlow's default")
    p.add_argument("--controller", choices=["mpi", "gloo"], default="mpi")
    p.add_argument("--gloo", dest="controller", action="store_const", const="gloo", help="--controller gloo")
    p.add_argument("--verify_replicas", action="store_true")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    if args.num_warmup_batches is None:
        # tf_cnn_benchmarks warms up longer; a CPU run should be short
        args.num_warmup_batches = max(1, min(10, args.num_batches // 10))
    return args


# ---------------------------------------------------------------- Horovod's Gloo rendezvous


def gloo_environment() -> None:
    """Horovod's HOROVOD_* variables for its Gloo controller, from mpilaunch's rank variables.

    Rank 0 serves Horovod's own HTTP rendezvous (what horovodrun runs) at
    MASTER_ADDR:MASTER_PORT, the free port mpilaunch's rank wrapper chose on
    worker 0; the plan it serves assumes workers of equal size.
    """
    env = os.environ
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
    if missing := [name for name in names if name not in env]:
        sys.exit(f"--controller gloo needs the rank variables mpilaunch sets; missing: {' '.join(missing)}")
    rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank, slots, node = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"]), int(env["NODE_RANK"])
    addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    if size % slots:
        sys.exit(f"--controller gloo needs workers of equal size (rank {rank}: {slots} of {size})")
    env.update(
        HOROVOD_CONTROLLER="gloo",
        HOROVOD_CPU_OPERATIONS="gloo",  # Horovod 0.28.1 crashes mixing the MPI controller with Gloo ops
        HOROVOD_GLOO_RENDEZVOUS_ADDR=addr,
        HOROVOD_GLOO_RENDEZVOUS_PORT=str(port),
        HOROVOD_HOSTNAME=f"node{node}",
        HOROVOD_RANK=str(rank),
        HOROVOD_SIZE=str(size),
        HOROVOD_LOCAL_RANK=str(local_rank),
        HOROVOD_LOCAL_SIZE=str(slots),
        HOROVOD_CROSS_RANK=str(node),
        HOROVOD_CROSS_SIZE=str(size // slots),
    )
    if rank == 0:
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        hosts = parse_hosts(",".join(f"node{n}:{slots}" for n in range(size // slots)))
        server = RendezvousHTTPServer(("", port), RendezvousHandler, 0)
        server.init(get_host_assignments(hosts, size))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return
    # Horovod's HTTP store gives up after a few tries: wait until rank 0 serves
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection((addr, port), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# ---------------------------------------------------------------- the model


def conv(x, filters, kernel, stride, name):
    """A bias-free convolution (batch norm follows), He-initialised as in the ResNet paper."""
    init = v1.variance_scaling_initializer(scale=2.0, mode="fan_out")
    w = v1.get_variable(name, [kernel, kernel, int(x.shape[-1]), filters], initializer=init)
    v1.add_to_collection("weights", w)  # weight decay applies to these only
    return tf.nn.conv2d(x, w, [1, stride, stride, 1], "SAME")


def batch_norm(x, name):
    """Training-mode batch norm on the batch's own statistics: a benchmark never evaluates,
    so it needs no moving averages (which would be per-rank state outside the broadcast check)."""
    with v1.variable_scope(name):
        channels = int(x.shape[-1])
        gamma = v1.get_variable("gamma", [channels], initializer=v1.ones_initializer())
        beta = v1.get_variable("beta", [channels], initializer=v1.zeros_initializer())
    mean, variance = tf.nn.moments(x, [0, 1, 2])
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-5)


def residual_block(x, filters, stride, name):
    """The basic block of CIFAR ResNets (two 3x3 convs); a 1x1 projection when the shape changes."""
    with v1.variable_scope(name):
        shortcut = x
        if stride != 1 or int(x.shape[-1]) != filters:
            shortcut = batch_norm(conv(x, filters, 1, stride, "proj"), "proj_bn")
        y = tf.nn.relu(batch_norm(conv(x, filters, 3, stride, "conv1"), "bn1"))
        y = batch_norm(conv(y, filters, 3, 1, "conv2"), "bn2")
        return tf.nn.relu(y + shortcut)


def resnet(images, model, classes):
    """He et al.'s CIFAR ResNet: 16/32/64 filters, three stages of n blocks. ImageNet-sized
    inputs first go through a stride-2 7x7 conv and a max pool (224 -> 56), as ImageNet ResNets do."""
    blocks = MODELS[model]
    with v1.variable_scope(model):
        if int(images.shape[1]) > 64:
            x = tf.nn.relu(batch_norm(conv(images, 16, 7, 2, "stem"), "stem_bn"))
            x = tf.nn.max_pool2d(x, 3, 2, "SAME")
        else:
            x = tf.nn.relu(batch_norm(conv(images, 16, 3, 1, "stem"), "stem_bn"))
        for stage, filters in enumerate((16, 32, 64)):
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                x = residual_block(x, filters, stride, f"stage{stage}_block{block}")
        x = tf.reduce_mean(x, [1, 2])  # global average pool
        w = v1.get_variable("fc/weights", [64, classes], initializer=v1.glorot_uniform_initializer())
        b = v1.get_variable("fc/biases", [classes], initializer=v1.zeros_initializer())
        v1.add_to_collection("weights", w)
        return tf.matmul(x, w) + b


def synthetic_inputs(batch_size, size, classes):
    """One random batch kept in local variables, as tf_cnn_benchmarks' synthetic data: the input
    pipeline costs nothing and only the model is timed. Local variables are not broadcast, so each
    rank trains on its own batch (a different seed per rank)."""
    local = [v1.GraphKeys.LOCAL_VARIABLES]
    images = v1.Variable(v1.truncated_normal([batch_size, size, size, 3]), trainable=False, collections=local)
    labels = v1.Variable(
        v1.random_uniform([batch_size], 0, classes, dtype=tf.int32), trainable=False, collections=local
    )
    return images, labels


# ---------------------------------------------------------------- checks and timing


def checksum(values) -> dict:
    """The trainable variables' float64 sum and the sha256 of their bytes (in name order)."""
    digest = hashlib.sha256()
    for value in values:
        digest.update(np.ascontiguousarray(value).tobytes())
    return {"sum": float(sum(np.sum(v, dtype=np.float64) for v in values)), "sha256": digest.hexdigest()}


def timing_str(batch_size, times):
    """tf_cnn_benchmarks' step line: mean rate, its standard error, and a robust spread (MAD)."""
    times = np.array(times)
    speeds = batch_size / times
    mean = batch_size / np.mean(times)
    uncertainty = np.std(speeds) / np.sqrt(len(speeds))
    jitter = 1.4826 * np.median(np.abs(speeds - np.median(speeds)))
    return f"images/sec: {mean:.1f} +/- {uncertainty:.1f} (jitter = {jitter:.1f})"


def main(argv=None) -> int:
    args = parse_args(argv)
    v1.disable_eager_execution()  # graph mode: the session-based Horovod path tf_cnn_benchmarks uses
    horovod = args.variable_update == "horovod"
    if horovod:
        if args.controller == "gloo":
            gloo_environment()  # before hvd.init(), which reads these variables
        import horovod.tensorflow as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    else:
        hvd, rank, size = None, 0, 1
    log = print if rank == 0 else (lambda *a, **k: None)
    image_size, classes, epoch_images = DATASETS[args.data_name]

    log(f"TensorFlow:  {tf.__version__}")
    log(f"Model:       {args.model}")
    log(f"Dataset:     {args.data_name} (synthetic)")
    log("Mode:        training")
    log("SingleSess:  False")
    log(f"Batch size:  {args.batch_size * size} global")
    log(f"             {args.batch_size} per device")
    log(f"Num batches: {args.num_batches}")
    log(f"Num epochs:  {args.num_batches * args.batch_size * size / epoch_images:.2f}")
    log(f"Devices:     {[f'horovod/cpu:{i}' for i in range(size)] if horovod else ['/cpu:0']}")
    log("NUMA bind:   False")
    log("Data format: NHWC")
    log(f"Optimizer:   {args.optimizer}")
    log(f"Variables:   {args.variable_update}")
    log("==========")
    log("Generating training model")

    v1.set_random_seed(args.seed + rank)  # ranks start different: the broadcast must make them equal
    images, labels = synthetic_inputs(args.batch_size, image_size, classes)
    logits = resnet(images, args.model, classes)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    total_loss = loss + args.weight_decay * tf.add_n([tf.nn.l2_loss(w) for w in v1.get_collection("weights")])
    if args.optimizer == "momentum":
        opt = v1.train.MomentumOptimizer(args.init_learning_rate, momentum=0.9)
    else:
        opt = v1.train.GradientDescentOptimizer(args.init_learning_rate)
    if horovod:
        opt = hvd.DistributedOptimizer(opt)  # allreduce-averages the gradients before they are applied
    global_step = v1.train.get_or_create_global_step()
    train_op = opt.minimize(total_loss, global_step=global_step)
    trainables = sorted(v1.trainable_variables(), key=lambda v: v.name)
    init_ops = [v1.global_variables_initializer(), v1.local_variables_initializer()]
    # rank 0's weights (and optimizer slots, global step) everywhere; built before the session starts
    broadcast = hvd.broadcast_global_variables(0) if horovod else tf.no_op()
    if horovod:  # the job's rate: every rank's own rate summed
        rate_in = v1.placeholder(tf.float64, [])
        rate_sum = hvd.allreduce(rate_in, op=hvd.Sum, name="images_per_sec")

    config = v1.ConfigProto(
        intra_op_parallelism_threads=args.num_intra_threads, inter_op_parallelism_threads=args.num_inter_threads
    )
    log("Initializing graph")
    with v1.Session(config=config) as sess:
        sess.run(init_ops)
        sess.run(broadcast)
        initial = checksum(sess.run(trainables)) if args.verify_replicas else None
        fail_rank = os.environ.get("TFHVD_FAIL_RANK")
        times = []
        log("Running warm up")
        for step in range(-args.num_warmup_batches, args.num_batches):
            start = time.perf_counter()
            _, loss_value = sess.run([train_op, total_loss])
            elapsed = time.perf_counter() - start
            if fail_rank == str(rank):  # the first step is done: now this rank dies
                print(f"rank {rank} fails on purpose after the first step", file=sys.stderr, flush=True)
                os._exit(int(os.environ.get("TFHVD_FAIL_CODE", "43")))
            if step < 0:
                continue
            if step == 0:
                log("Done warm up")
                log("Step\tImg/sec\ttotal_loss")
            times.append(elapsed)
            if step == 0 or (step + 1) % args.display_every == 0:
                log(f"{step + 1}\t{timing_str(args.batch_size, times)}\t{loss_value:.3f}")
        # the rate over the timed steps only (warm-up excluded), as tf_cnn_benchmarks reports it
        own_rate = args.batch_size * len(times) / sum(times) if times else 0.0
        total_rate = float(sess.run(rate_sum, {rate_in: own_rate})) if horovod else own_rate
        log("-" * 64)
        log(f"total images/sec: {total_rate:.2f}")
        log("-" * 64)

        ok = True
        if args.verify_replicas:
            final = checksum(sess.run(trainables))
            if horovod:
                mine = {"rank": rank, "initial": initial["sha256"], "final": final["sha256"]}
                everyone = hvd.allgather_object(mine, session=sess, name="checksums")
            else:
                everyone = [{"initial": initial["sha256"], "final": final["sha256"]}]
            identical = all(r["final"] == final["sha256"] for r in everyone)
            moved = final["sha256"] != initial["sha256"]
            ok = identical and moved
            result = {
                "rank": rank,
                "size": size,
                "local_rank": hvd.local_rank() if horovod else 0,
                "local_size": hvd.local_size() if horovod else 1,
                "cross_rank": hvd.cross_rank() if horovod else 0,
                "cross_size": hvd.cross_size() if horovod else 1,
                "identical": identical,
                "moved": moved,
                # rank 0's weights reached every rank (they started different)
                "broadcast": all(r["initial"] == initial["sha256"] for r in everyone),
                "checksum": final["sum"],
                "sha256": final["sha256"],
                "params": int(sum(np.prod(v.shape) for v in trainables)),
                "steps": int(sess.run(global_step)),
                "tf_version": tf.__version__,
                "horovod_version": __import__("horovod").__version__ if horovod else None,
                "controller": ("mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else None)
                if horovod
                else None,
                "images_per_sec": round(own_rate, 2),
                "total_images_per_sec": round(total_rate, 2),
                "worker": os.environ.get("MPILAUNCH_WORKER"),
            }
            print("TFHVD " + json.dumps(result), flush=True)
        if horovod:
            # a last collective as a barrier: under Gloo, rank 0's process serves the rendezvous
            sess.run(hvd.allreduce(tf.constant(0.0), op=hvd.Sum, name="barrier"))
    if horovod:
        hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
