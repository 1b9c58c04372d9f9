"""TensorFlow's parameter-server training tutorial as a user runs it under tfcluster: ``Model.fit`` with
ParameterServerStrategy, then a custom ``ClusterCoordinator`` loop, then a scheduled evaluation.

    python -m worker_entry.examples.ps_tutorial [--fit-epochs 5] [--fit-steps 20] [--loop-epochs 4] [--loop-steps 5]

The code is the notebook's (tensorflow/docs, site/en/tutorials/distribute/parameter_server_training.ipynb),
cell by cell, with no tfcluster call: tfcluster's instrumentation counts fit's steps (its Keras callback)
and the loop's (the coordinator's schedules; the scheduled evaluation is no training step). The edits,
each needed to run it as a cluster of processes rather than in one notebook:

1. The cluster: the notebook starts in-process servers (``create_in_process_cluster``). Here every task
   is its own process with the ``TF_CONFIG`` tfcluster sets: the cluster resolver is
   ``TFConfigClusterResolver``, and the ``worker`` and ``ps`` tasks start a ``tf.distribute.Server`` and
   wait (the tutorial's "Clusters in the real world" section; ``ps_coordinator.serve``).
2. ``NUM_PS`` is the cluster's ps count; the embedding's shards are printed, not asserted to be 2 of
   shape (4, 16384) (that holds with the notebook's 2 ps only).
3. ``working_dir`` is ``--working-dir`` (default: ``tutorial`` in the task's directory), not
   ``/tmp/my_working_dir``, which every run on a host would share.
4. ``TF_USE_LEGACY_KERAS=1``: the notebook's ``tf.keras.optimizers.legacy`` is Keras 2's (tf_keras).
5. The sizes are flags, the notebook's values their defaults (a test runs fewer fit epochs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # edit 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fit-epochs", type=int, default=5, help="Model.fit epochs (the notebook: 5)")
    p.add_argument("--fit-steps", type=int, default=20, help="Model.fit steps per epoch (the notebook: 20)")
    p.add_argument("--loop-epochs", type=int, default=4, help="the coordinator loop's epochs (the notebook: 4)")
    p.add_argument("--loop-steps", type=int, default=5, help="the loop's steps per epoch (the notebook: 5)")
    p.add_argument("--eval-steps", type=int, default=2, help="scheduled evaluation steps (the notebook: 2)")
    p.add_argument("--working-dir", default="tutorial", help="the callbacks' directory (edit 3)")
    return p.parse_args(argv)


def tutorial(args: argparse.Namespace) -> None:
    import tensorflow as tf

    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()  # edit 1
    NUM_PS = cluster_resolver.cluster_spec().num_tasks("ps")  # edit 2

    variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=(256 << 10), max_shards=NUM_PS
    )
    strategy = tf.distribute.ParameterServerStrategy(cluster_resolver, variable_partitioner=variable_partitioner)

    # --- Model.fit
    global_batch_size = 64
    x = tf.random.uniform((10, 10))
    y = tf.random.uniform((10,))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
    dataset = dataset.batch(global_batch_size)
    dataset = dataset.prefetch(2)
    with strategy.scope():
        model = tf.keras.models.Sequential([tf.keras.layers.Dense(10)])
        model.compile(tf.keras.optimizers.legacy.SGD(), loss="mse", steps_per_execution=10)
    working_dir = args.working_dir  # edit 3
    log_dir = os.path.join(working_dir, "log")
    ckpt_filepath = os.path.join(working_dir, "ckpt")
    backup_dir = os.path.join(working_dir, "backup")
    callbacks = [
        tf.keras.callbacks.TensorBoard(log_dir=log_dir),
        tf.keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
        tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir),
    ]
    model.fit(dataset, epochs=args.fit_epochs, steps_per_epoch=args.fit_steps, callbacks=callbacks)

    # --- a custom training loop: data, model, step function
    feature_vocab = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"]
    label_vocab = ["yes", "no"]
    with strategy.scope():
        feature_lookup_layer = tf.keras.layers.StringLookup(vocabulary=feature_vocab, mask_token=None)
        label_lookup_layer = tf.keras.layers.StringLookup(vocabulary=label_vocab, num_oov_indices=0, mask_token=None)
        raw_feature_input = tf.keras.layers.Input(shape=(3,), dtype=tf.string, name="feature")
        feature_id_input = feature_lookup_layer(raw_feature_input)
        feature_preprocess_stage = tf.keras.Model({"features": raw_feature_input}, feature_id_input)
        raw_label_input = tf.keras.layers.Input(shape=(1,), dtype=tf.string, name="label")
        label_id_input = label_lookup_layer(raw_label_input)
        label_preprocess_stage = tf.keras.Model({"label": raw_label_input}, label_id_input)

    def feature_and_label_gen(num_examples=200):
        examples = {"features": [], "label": []}
        for _ in range(num_examples):
            features = random.sample(feature_vocab, 3)
            label = ["yes"] if "avenger" in features else ["no"]
            examples["features"].append(features)
            examples["label"].append(label)
        return examples

    examples = feature_and_label_gen()

    def dataset_fn(_):
        raw_dataset = tf.data.Dataset.from_tensor_slices(examples)
        train_dataset = (
            raw_dataset.map(
                lambda x: ({"features": feature_preprocess_stage(x["features"])}, label_preprocess_stage(x["label"]))
            )
            .shuffle(200)
            .batch(32)
            .repeat()
        )
        return train_dataset

    with strategy.scope():
        model_input = tf.keras.layers.Input(shape=(3,), dtype=tf.int64, name="model_input")
        emb_layer = tf.keras.layers.Embedding(input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=16384)
        emb_output = tf.reduce_mean(emb_layer(model_input), axis=1)
        dense_output = tf.keras.layers.Dense(
            units=1, activation="sigmoid", kernel_regularizer=tf.keras.regularizers.L2(1e-4)
        )(emb_output)
        model = tf.keras.Model({"features": model_input}, dense_output)
        optimizer = tf.keras.optimizers.legacy.RMSprop(learning_rate=0.1)
        accuracy = tf.keras.metrics.Accuracy()
    print("embedding shards:", [(w.shape, w.device) for w in emb_layer.weights])  # edit 2

    @tf.function
    def step_fn(iterator):
        def replica_fn(batch_data, labels):
            with tf.GradientTape() as tape:
                pred = model(batch_data, training=True)
                per_example_loss = tf.keras.losses.BinaryCrossentropy(reduction=tf.keras.losses.Reduction.NONE)(
                    labels, pred
                )
                loss = tf.nn.compute_average_loss(per_example_loss)
                model_losses = model.losses
                if model_losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))  # noqa: B905 - as the notebook
            actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
            accuracy.update_state(labels, actual_pred)
            return loss

        batch_data, labels = next(iterator)
        losses = strategy.run(replica_fn, args=(batch_data, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    # --- the coordinator loop
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
    per_worker_iterator = iter(per_worker_dataset)
    num_epochs = args.loop_epochs
    steps_per_epoch = args.loop_steps
    for i in range(num_epochs):
        accuracy.reset_states()
        for _ in range(steps_per_epoch):
            coordinator.schedule(step_fn, args=(per_worker_iterator,))
        # Wait at epoch boundaries.
        coordinator.join()
        print("Finished epoch %d, accuracy is %f." % (i, accuracy.result().numpy()), flush=True)  # noqa: UP031
    loss = coordinator.schedule(step_fn, args=(per_worker_iterator,))
    print("Final loss is %f" % loss.fetch(), flush=True)  # noqa: UP031

    # --- evaluation: inline on the chief, then scheduled on the workers
    eval_dataset = (
        tf.data.Dataset.from_tensor_slices(feature_and_label_gen(num_examples=16))
        .map(lambda x: ({"features": feature_preprocess_stage(x["features"])}, label_preprocess_stage(x["label"])))
        .batch(8)
    )
    eval_accuracy = tf.keras.metrics.Accuracy()
    for batch_data, labels in eval_dataset:
        pred = model(batch_data, training=False)
        actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
        eval_accuracy.update_state(labels, actual_pred)
    print("Evaluation accuracy: %f" % eval_accuracy.result(), flush=True)  # noqa: UP031

    with strategy.scope():
        eval_accuracy = tf.keras.metrics.Accuracy()

    @tf.function
    def eval_step(iterator):
        def replica_fn(batch_data, labels):
            pred = model(batch_data, training=False)
            actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
            eval_accuracy.update_state(labels, actual_pred)

        batch_data, labels = next(iterator)
        strategy.run(replica_fn, args=(batch_data, labels))

    def eval_dataset_fn():
        return (
            tf.data.Dataset.from_tensor_slices(feature_and_label_gen(num_examples=16))
            .map(lambda x: ({"features": feature_preprocess_stage(x["features"])}, label_preprocess_stage(x["label"])))
            .shuffle(16)
            .repeat()
            .batch(8)
        )

    per_worker_eval_dataset = coordinator.create_per_worker_dataset(eval_dataset_fn)
    per_worker_eval_iterator = iter(per_worker_eval_dataset)
    eval_steps_per_epoch = args.eval_steps
    for _ in range(eval_steps_per_epoch):
        coordinator.schedule(eval_step, args=(per_worker_eval_iterator,))
    coordinator.join()
    print("Evaluation accuracy: %f" % eval_accuracy.result(), flush=True)  # noqa: UP031


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task") or {}
    kind, index = task.get("type"), int(task.get("index", 0))
    if kind in ("worker", "ps"):  # edit 1: a server the coordinator drives
        from .ps_coordinator import serve

        return serve(kind, index)
    if kind == "chief":
        tutorial(args)
        return 0
    print(f"ps_tutorial: task type {kind!r} has nothing to do here (chief, worker or ps)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
