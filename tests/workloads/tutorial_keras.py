"""TensorFlow's "Multi-worker training with Keras" tutorial (tensorflow.org/tutorials/distribute/multi_worker_with_keras),
as written there, with MNIST swapped for synthetic arrays of the same shape (no download) and the epochs
and steps per epoch as arguments. Nothing of tfcluster: the dataset is batched without drop_remainder,
so its batch dimension is not static; fit runs with its default verbosity.

    python tests/workloads/tutorial_keras.py [--epochs 3] [--steps-per-epoch 70] [--examples 8192]
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf


def mnist_dataset(batch_size, examples):
    rng = np.random.default_rng(0)  # (x_train, y_train), _ = tf.keras.datasets.mnist.load_data()
    x_train = rng.integers(0, 256, size=(examples, 28, 28), dtype=np.uint8)
    y_train = rng.integers(0, 10, size=(examples,), dtype=np.uint8)
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(examples).repeat().batch(batch_size)
    return train_dataset


def build_and_compile_cnn_model():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
        metrics=["accuracy"],
    )
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=70)
    p.add_argument("--examples", type=int, default=8192)
    args = p.parse_args()

    per_worker_batch_size = 64
    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    global_batch_size = per_worker_batch_size * num_workers
    multi_worker_dataset = mnist_dataset(global_batch_size, args.examples)

    with strategy.scope():
        # Model building/compiling need to be within `strategy.scope()`.
        multi_worker_model = build_and_compile_cnn_model()

    multi_worker_model.fit(multi_worker_dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch)


if __name__ == "__main__":
    main()
