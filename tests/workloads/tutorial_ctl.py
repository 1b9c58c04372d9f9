"""TensorFlow's "Custom training loop with Keras and MultiWorkerMirroredStrategy" tutorial
(tensorflow.org/tutorials/distribute/multi_worker_with_ctl), as written there, with MNIST swapped for
synthetic arrays of the same shape (no download), the epochs and steps per epoch as arguments, and no
checkpointing. Nothing of tfcluster: ``distribute_datasets_from_function`` batches each replica's
shard without drop_remainder, and ``next(iterator)`` runs inside the ``tf.function``.

    python tests/workloads/tutorial_ctl.py [--epochs 3] [--steps-per-epoch 70] [--examples 16384]
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf


def mnist_dataset(examples):
    rng = np.random.default_rng(0)  # (x_train, y_train), _ = tf.keras.datasets.mnist.load_data()
    x_train = rng.integers(0, 256, size=(examples, 28, 28), dtype=np.uint8)
    y_train = rng.integers(0, 10, size=(examples,), dtype=np.uint8)
    # The `x` arrays are in uint8 and have values in the range [0, 255].
    # You need to convert them to float32 with values in the range [0, 1]
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(examples)
    return train_dataset


def dataset_fn(global_batch_size, input_context, examples):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = mnist_dataset(examples)
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    return dataset


def build_cnn_model():
    regularizer = tf.keras.regularizers.L2(1e-5)
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu", kernel_regularizer=regularizer),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu", kernel_regularizer=regularizer),
            tf.keras.layers.Dense(10, kernel_regularizer=regularizer),
        ]
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=70)
    p.add_argument("--examples", type=int, default=16384)
    args = p.parse_args()

    tf_config = json.loads(os.environ["TF_CONFIG"])
    per_worker_batch_size = 64
    num_workers = len(tf_config["cluster"]["worker"])
    global_batch_size = per_worker_batch_size * num_workers

    num_epochs = args.epochs
    num_steps_per_epoch = args.steps_per_epoch

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    with strategy.scope():
        multi_worker_model = build_cnn_model()

        multi_worker_dataset = strategy.distribute_datasets_from_function(
            lambda input_context: dataset_fn(global_batch_size, input_context, args.examples)
        )
        optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")

    @tf.function
    def train_step(iterator):
        """Training step function."""

        def step_fn(inputs):
            """Per-Replica step function."""
            x, y = inputs
            with tf.GradientTape() as tape:
                predictions = multi_worker_model(x, training=True)
                per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True, reduction=tf.keras.losses.Reduction.NONE
                )(y, predictions)
                loss = tf.nn.compute_average_loss(per_example_loss)
                model_losses = multi_worker_model.losses
                if model_losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))

            grads = tape.gradient(loss, multi_worker_model.trainable_variables)
            optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))  # noqa: B905 (as in the tutorial)
            train_accuracy.update_state(y, predictions)
            return loss

        per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="epoch")
    step_in_epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="step_in_epoch")

    while epoch.numpy() < num_epochs:
        iterator = iter(multi_worker_dataset)
        total_loss = 0.0
        num_batches = 0

        while step_in_epoch.numpy() < num_steps_per_epoch:
            total_loss += train_step(iterator)
            num_batches += 1
            step_in_epoch.assign_add(1)

        train_loss = total_loss / num_batches
        print("Epoch: %d, accuracy: %f, train_loss: %f." % (epoch.numpy(), train_accuracy.result(), train_loss))  # noqa: UP031

        train_accuracy.reset_states()

        epoch.assign_add(1)
        step_in_epoch.assign(0)


if __name__ == "__main__":
    main()
