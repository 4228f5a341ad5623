"""Data-parallel Keras training with Horovod (tf.keras 2.15, horovod.tensorflow.keras), synthetic data.

    mpilaunch --np 4 --slots-per-worker 2 -- python examples/keras_horovod.py --epochs 2

Horovod's documented Keras recipe: hvd.init(), the learning rate scaled by the
number of ranks, the optimizer wrapped in hvd.DistributedOptimizer (gradients
averaged by allreduce), and three callbacks: BroadcastGlobalVariablesCallback(0)
(every rank starts from rank 0's weights), MetricAverageCallback (the epoch's
metrics averaged over the ranks, so rank 0 reports the job's, not its own) and
LearningRateWarmupCallback (ramps the scaled rate up over the first epoch:
large effective batches diverge if they start at full speed). Each rank trains
on its own shard of a synthetic, learnable problem; rank 0 prints the results.
"""

import argparse
import json
import os

# Quieter TensorFlow start-up (must be set before the import).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch_size", type=int, default=32, help="per rank")
parser.add_argument("--steps_per_epoch", type=int, default=20)
parser.add_argument("--learning_rate", type=float, default=0.05, help="per rank; scaled by the number of ranks")
args = parser.parse_args()

# Keras warns that the first batch's callbacks are slow: that is the broadcast, by design.
tf.get_logger().setLevel("ERROR")

hvd.init()
rank, size = hvd.rank(), hvd.size()
tf.random.set_seed(rank)  # different initial weights per rank: the broadcast callback must align them

# A synthetic 4-class problem every rank agrees on (one fixed set of class centres), with each rank
# drawing its own samples: the data-parallel shard.
centres = np.random.default_rng(0).normal(size=(4, 16)).astype("float32")
rng = np.random.default_rng(100 + rank)
labels = rng.integers(0, 4, size=args.batch_size * args.steps_per_epoch)
features = centres[labels] + rng.normal(scale=0.8, size=(len(labels), 16)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(len(labels), seed=rank)
dataset = dataset.repeat().batch(args.batch_size)

model = tf.keras.Sequential(
    [
        tf.keras.Input((16,)),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(4),
    ]
)
scaled_lr = args.learning_rate * size
# The legacy optimizer: Horovod 0.28.1's LearningRateWarmupCallback adjusts the momentum as a Keras
# variable, which the Keras 2.11+ optimizers no longer keep (AttributeError on the first batch).
optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(scaled_lr, momentum=0.9))
model.compile(
    optimizer=optimizer,
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),  # before any callback that reads the metrics
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=0),
]
history = model.fit(
    dataset,
    epochs=args.epochs,
    steps_per_epoch=args.steps_per_epoch,
    callbacks=callbacks,
    verbose=2 if rank == 0 else 0,  # one line per epoch, from rank 0 only
)

# Every rank must end with the same weights: allgather a checksum of them.
checksum = float(sum(np.sum(w, dtype=np.float64) for w in model.get_weights()))
checksums = hvd.allgather(np.array([checksum]), name="checksums").numpy().tolist()
if rank == 0:
    final = {key: round(float(values[-1]), 4) for key, values in history.history.items()}
    print(
        "KERAS "
        + json.dumps(
            {
                "size": size,
                "epochs": args.epochs,
                "final": final,
                "identical": len(set(checksums)) == 1,
                "tf_version": tf.__version__,
                "horovod_version": __import__("horovod").__version__,
            }
        ),
        flush=True,
    )
