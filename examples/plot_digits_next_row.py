"""
=====================================================
Next-row prediction on handwritten digits (real data)
=====================================================

scikit-learn's :func:`~sklearn.datasets.load_digits` images (8 x 8 pixels, shipped with
scikit-learn, no download) read as sequences: each image is 8 tokens, its rows, of 8 pixels scaled
to [0, 1]. The task is next-row prediction with causal readout (``readout="all"``): at position t
the model sees rows 1..t and predicts row t + 1. The last row has no successor, so the inputs are
rows 0..6 and the targets rows 1..7, seven predictions per image.

We compare the models a user would try, on held-out images:

(a) :class:`~sklearn_linattn.LinearAttentionRegressor` (the exact least-squares attention layer),
    with its ridge penalty chosen by cross-validation;
(b) ridge regression on lags: the current and the previous row as features, a strong simple
    baseline;
(c) :class:`~sklearn_linattn.AdamLinearAttentionRegressor`, the same model class trained by Adam;
(d) trivial baselines: repeat the current row, or predict the mean training image's next row;
(e) the attention layer with an intercept and a skip term, ``y = b + W x_t + MHLA``: the
    residual path a transformer block has around attention.

and read what the identifiability certificate says about these real inputs, and what it means
for trusting the attention model's predictions.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import RidgeCV
from sklearn.metrics import r2_score
from sklearn.model_selection import GridSearchCV, train_test_split

from sklearn_linattn import (
    AdamLinearAttentionRegressor,
    LinearAttentionRegressor,
    compare_to_optimum,
)
from sklearn_linattn.metrics import drop_padding, sequence_scorer

images = load_digits().images / 16.0  # (1797, 8, 8), pixels in [0, 1]
X, y = images[:, :7], images[:, 1:]  # rows 0..6 predict rows 1..7
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
print(f"{len(X_train)} training and {len(X_test)} test images; X_train {X_train.shape}, "
      f"y_train {y_train.shape}")

predictions = {}  # model name -> held-out predictions, shape (n_test, 7, 8)


def held_out_errors(pred, y_true=y_test):
    """Mean squared error per pixel and R^2 over every predicted row."""
    yt, yp, _ = drop_padding(y_true, pred, readout="all")  # (n * 7, 8): no padding here
    return np.mean((yt - yp) ** 2), r2_score(yt, yp, multioutput="variance_weighted")


# %%
# (a) The attention layer, exactly
# --------------------------------
# One least-squares solve per fit, so a small grid over the ridge penalty is cheap. The penalty
# acts on the coefficients of standardized tokens, so its scale does not depend on the data's
# units; the grid brackets the value that 2-fold cross-validation prefers.
# :func:`~sklearn_linattn.metrics.sequence_scorer` scores the positions of each sequence as
# samples, which scikit-learn's string scorers cannot do for 3-D targets.
search = GridSearchCV(
    LinearAttentionRegressor(readout="all"),
    {"alpha": [1e-4, 1e-3, 1e-2]},
    scoring=sequence_scorer("neg_mean_squared_error"),
    cv=2,
).fit(X_train, y_train)
attention = search.best_estimator_
print(f"alpha chosen by 2-fold CV: {search.best_params_['alpha']:g}")
predictions["(a) attention"] = attention.predict(X_test)
exact = LinearAttentionRegressor(readout="all").fit(X_train, y_train)  # alpha = 0
predictions["(a) attention, alpha=0"] = exact.predict(X_test)

# %%
# What the certificate says about these inputs
# --------------------------------------------
# A one-layer attention over 8-pixel tokens has psi = d^2 (d + 1) / 2 = 288 cubic coefficients.
# The certificate asks whether the training inputs determine all of them.
cert = exact.certificate_
print(cert.summary())
print(f"lambda_min = {cert.min_eigenvalue:.3g}, rank {cert.rank} of psi = {cert.n_features}")
ink = (X_train != 0).reshape(-1, 8).mean(axis=0)
print("fraction of training rows with ink in each pixel column:", np.round(ink, 3))

# %%
# They do not: 39 of the 288 directions are undetermined. The reason is visible in the data: the
# border columns 0 and 7 carry ink in 0.2 % and 2 % of the training rows, too rarely for the
# cubic features that involve them to be pinned down. Models that fit the training images equally
# well can therefore disagree on new images.
#
# The certificate still certifies individual inputs: ``covers`` says, per test image, whether the
# features of all its prefixes lie in the span of the training features. On a covered image every
# minimizer of the training loss makes the same predictions, so the fit's predictions there do not
# depend on an arbitrary choice among minimizers. On an uncovered image they do: the unpenalized
# (minimum-norm) fit extrapolates along directions the data never constrained.
covered = cert.covers(X_test)
print(f"covered test images: {covered.sum()} of {len(covered)} ({covered.mean():.1%})")
for name in ["(a) attention, alpha=0", "(a) attention"]:
    pred = predictions[name]
    mse_in, _ = held_out_errors(pred[covered], y_test[covered])
    mse_out, _ = held_out_errors(pred[~covered], y_test[~covered])
    print(f"{name:24s} MSE per pixel: covered {mse_in:.4f}, not covered {mse_out:.4g}")

# %%
# The few uncovered images are where the alpha=0 fit fails badly; the ridge penalty chosen by
# cross-validation picks one minimizer that stays moderate along the undetermined directions,
# and its error on them is close to that on the rest. Coverage is thus a per-input flag for
# trusting an exact fit: a covered prediction is the data's, an uncovered one the regularizer's.
#
# (b) Ridge on lags
# -----------------
# For position t: the current row and the previous one (zeros at t = 0), 16 features, one Ridge
# for all positions, penalty chosen by RidgeCV's leave-one-out error.


def lags(X):
    previous = np.concatenate([np.zeros_like(X[:, :1]), X[:, :-1]], axis=1)
    return np.concatenate([X, previous], axis=2).reshape(-1, 2 * X.shape[2])


ridge = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(lags(X_train), y_train.reshape(-1, 8))
print(f"Ridge on lags: alpha chosen {ridge.alpha_:.3g}")
predictions["(b) Ridge on lags"] = ridge.predict(lags(X_test)).reshape(y_test.shape)

# %%
# (c) The same model class, trained by Adam
# -----------------------------------------
# Four heads, 40 epochs. :func:`~sklearn_linattn.compare_to_optimum` measures the trained layer
# against the exact optimum of its training data: its excess training risk (risk summed over the
# 8 pixels of a row, averaged over the rows), and the certificate's reading of it.
adam = AdamLinearAttentionRegressor(
    n_heads=4, readout="all", learning_rate=0.03, batch_size=64, max_epochs=40, random_state=0,
).fit(X_train, y_train)
predictions["(c) Adam, 4 heads"] = adam.predict(X_test)
report = compare_to_optimum(adam, X_train, y_train)
print(report.summary())

# %%
# Adam stops well above the optimum's training risk. The data does not identify the function,
# so ``p_distance`` is not a distance to *the* solution here: the optimum is only the
# minimum-norm point of a set of minimizers (its coefficients are large along the rarely-inked
# border directions). ``training_distance``, the root-mean-square gap between the two models'
# outputs on the training rows, is what measures how far Adam is from optimal.
#
# (d) Trivial baselines
# ---------------------
predictions["(d) repeat current row"] = X_test
mean_image = y_train.mean(axis=0)
predictions["(d) mean training image"] = np.broadcast_to(mean_image, y_test.shape)

# %%
# (e) Attention with an intercept and a skip term
# -----------------------------------------------
# ``fit_intercept=True`` adds a constant per pixel and ``fit_skip=True`` a linear map of the
# current row, both fitted jointly with the attention coefficients (exactly: the same least
# squares, 297 coefficients per pixel instead of 288). The certificate is then about the whole
# linear class. Cross-validation now prefers a much larger penalty: the two terms carry most of
# the signal, and the attention coefficients are shrunk.
terms_search = GridSearchCV(
    LinearAttentionRegressor(readout="all", fit_intercept=True, fit_skip=True),
    {"alpha": [1e-2, 1.0, 100.0]},
    scoring=sequence_scorer("neg_mean_squared_error"),
    cv=2,
).fit(X_train, y_train)
residual = terms_search.best_estimator_
print(f"alpha chosen by 2-fold CV: {terms_search.best_params_['alpha']:g}")
predictions["(e) attention + intercept + skip"] = residual.predict(X_test)
print(residual.certificate_.summary())
print(f"covered test images: {residual.certificate_.covers(X_test).mean():.1%}")

# %%
# Held-out errors
# ---------------
results = {name: held_out_errors(pred) for name, pred in predictions.items()}
for name, (mse, r2) in results.items():
    print(f"{name:34s} MSE per pixel {mse:8.4f}   R^2 {r2:8.3f}")

shown = [name for name in results if name != "(a) attention, alpha=0"]  # off the scale
fig, ax = plt.subplots(figsize=(7, 3.2))
ax.barh(shown[::-1], [results[name][0] for name in shown[::-1]], color="tab:blue")
ax.set_xlabel("held-out mean squared error per pixel")
ax.set_title("Next-row prediction on the digits")
fig.tight_layout()
plt.show()

# %%
# Attention alone is behind even the mean image. This is the model class, not its fit: the exact
# solution is the best any one-layer linear attention can do on these images. Its output is a
# homogeneous cubic function of the rows, with no constant term (so it cannot predict the average
# digit's next row when the current row is empty) and no linear term (so it cannot simply pass
# the current row on, which the lagged Ridge does). Adam, in the same class, stays above the
# optimum's training risk, and on held-out images it is behind the trivial baselines too. Give
# the layer those two terms, as a transformer block's residual path does, and it moves ahead of
# every model but Ridge on lags, and close to it (Ridge also sees the previous row, which the
# skip term does not): the cubic attention features then add to a linear baseline instead of
# having to replace it.
#
# True and predicted rows
# -----------------------
# Each predicted row is made from the true rows above it; row 0 is given. The last column is an
# uncovered test image. Predictions are clipped to [0, 1] for display: on that image the alpha=0
# fit's errors reach far beyond it (the 60 above is a mean squared error per pixel).
picks = list(np.flatnonzero(covered)[:4]) + [int(np.flatnonzero(~covered)[0])]
panels = [("true", np.concatenate([X_test[:, :1], y_test], axis=1))] + [
    (name, np.concatenate([X_test[:, :1], predictions[name]], axis=1))
    for name in ["(a) attention", "(a) attention, alpha=0", "(b) Ridge on lags",
                 "(e) attention + intercept + skip"]
]
fig, axes = plt.subplots(len(panels), len(picks), figsize=(1.6 * len(picks), 1.7 * len(panels)))
for row, (name, stack) in zip(axes, panels):
    for ax, i in zip(row, picks):
        ax.imshow(np.clip(stack[i], 0, 1), cmap="gray_r", vmin=0, vmax=1)
        ax.set_xticks([])
        ax.set_yticks([])
    row[0].set_ylabel(name.replace(", ", ",\n"), fontsize=8)
axes[0, -1].set_title("not covered", fontsize=8)
fig.tight_layout()
plt.show()
