"""Parameter-server training of a tiny Keras model, configured only by TF_CONFIG.

    mpilaunch --mode ps --chief --workers 2 --ps 1 -- python examples/ps_keras.py --steps 20

This follows TensorFlow's documented ParameterServerStrategy pattern: ps and
worker tasks start a ``tf.distribute.Server`` for the cluster in TF_CONFIG
and block forever (they never exit by themselves; mpilaunch ends them when
the chief is done), the chief runs the coordinator.  Keras 3 (TF >= 2.16)
no longer supports ``Model.fit`` under ParameterServerStrategy, so the
chief uses the documented custom training loop with a Keras model.

The chief prints the address of every task and where the variables live, so
a test can check that the work really went through the cluster.
"""

import argparse
import json
import os
import sys

# Quieter TensorFlow start-up (must be set before the import).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf


def run_server(resolver) -> None:
    # Documented: workers/ps fail fast so the coordinator sees a lost task.
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"{resolver.task_type}:{resolver.task_id} serving at {server.target}", flush=True)
    server.join()


def _device(variable) -> str:
    try:
        return variable.device  # tf.Variable (Keras 2)
    except AttributeError:
        return variable.value.device  # Keras 3 wraps the tf.Variable


def run_chief(resolver, steps: int, output: str | None) -> None:
    import keras

    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        variables = model.trainable_variables

    def dataset_fn():
        x = tf.random.uniform((256, 4), seed=1)
        y = tf.reduce_sum(x, axis=1, keepdims=True)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)

    per_worker_iter = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(iterator):
        def replica_step(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, variables)
            for var, grad in zip(variables, grads):
                var.assign_sub(0.05 * grad)  # plain SGD, applied on the ps
            return loss

        losses = strategy.run(replica_step, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    # the loss on the whole (fixed) dataset before and after: a step's loss is one batch's, on
    # whichever batch that worker's iterator was at, with the other worker's updates landing
    # meanwhile, so the first and last steps' losses need not be in order (seen: 0.15 then 0.26)
    probe_x = tf.random.uniform((256, 4), seed=1)
    probe_y = tf.reduce_sum(probe_x, axis=1, keepdims=True)

    def dataset_loss() -> float:
        return float(tf.reduce_mean(tf.square(model(probe_x) - probe_y)))

    loss_before = dataset_loss()
    results = [coordinator.schedule(train_step, args=(per_worker_iter,)) for _ in range(steps)]
    coordinator.join()
    losses = [float(r.fetch()) for r in results]
    loss_after = dataset_loss()
    devices = sorted({_device(v) for v in variables})
    summary = {
        "cluster": resolver.cluster_spec().as_dict(),
        "steps": len(losses),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "loss_before": loss_before,
        "loss_after": loss_after,
        "variable_devices": devices,
    }
    print("PS-KERAS " + json.dumps(summary, sort_keys=True), flush=True)
    if output:
        os.makedirs(output, exist_ok=True)
        with open(os.path.join(output, "ps_keras.json"), "w") as f:
            json.dump(summary, f)
    if not all(d.startswith("/job:ps/") for d in devices):
        sys.exit(f"variables are not on the ps tasks: {devices}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if "TF_CONFIG" not in os.environ:
        sys.exit("TF_CONFIG is not set: run me under mpilaunch --mode ps")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        run_server(resolver)
    elif resolver.task_type == "chief":
        run_chief(resolver, args.steps, os.environ.get("DTF_OUTPUT_PATH"))
    else:
        # An evaluator would read checkpoints from DTF_OUTPUT_PATH; this
        # example has none, so it has nothing to do.
        print(f"{resolver.task_type}:{resolver.task_id}: nothing to do", flush=True)


if __name__ == "__main__":
    main()
