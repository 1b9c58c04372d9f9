"""A plain Keras ``fit`` with the default verbosity: its progress bar redraws one line with ``\\r`` and
``\\b`` (Keras 3 also colours it), a step every ~50 ms so the bar is seen mid-epoch. For
test_progress_bars_e2e.py. Usage: keras_bar.py [EPOCHS] [STEPS]."""

import sys
import time

import keras
import numpy as np

EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 30


class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.05)


rng = np.random.default_rng(0)
x = rng.random((STEPS * 16, 8), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, y, batch_size=16, epochs=EPOCHS, callbacks=[Slow()])  # verbose: the default ("auto" = 1)
print("fit done", flush=True)
