"""Round-trip errors of the layout conversions and of the PyTorch layer.

Measures, over random layers of every supported shape, the relative error of
the coefficients p(Theta) after

- heads -> standard projections (any d_k, d_v, score scale) -> heads;
- the paper's layout -> heads -> the paper's layout;
- a fitted estimator -> ``to_torch`` -> ``from_torch`` (float64);

and the error of a float32 module against ``predict`` on sequences four times
longer than the training ones.  The torch rows need the ``torch`` extra.

Run:  python benchmarks/round_trips.py [--seed 0]
"""

import argparse
import itertools

import numpy as np

from sklearn_linattn import (
    LinearAttentionRegressor,
    attention_coefficients,
    heads_from_paper,
    heads_from_projections,
    mhla_forward,
    paper_from_heads,
    projections_from_heads,
)


def relative(Va, Qa, Vb, Qb):
    pa, pb = attention_coefficients(Va, Qa), attention_coefficients(Vb, Qb)
    return np.linalg.norm(pa - pb) / np.linalg.norm(pb)


def projections(rng):
    worst, n = 0.0, 0
    for H, d, d_out, d_k, d_v in itertools.product(
            [1, 2, 4], [1, 2, 3, 5], [1, 2, 4], [None, 1, 2, 3, 6], [None, 1, 2, 5]):
        V, Q = rng.normal(size=(H, d_out, d)), rng.normal(size=(H, d, d))
        layer = projections_from_heads(V, Q, d_k=d_k, d_v=d_v, scale=0.37)
        worst = max(worst, relative(*heads_from_projections(*layer, scale=0.37), V, Q))
        n += 1
    print(f"heads -> projections -> heads   {n:4d} shapes   max relative error {worst:.2e}")


def paper(rng):
    worst, n = 0.0, 0
    for m, d, d_out in itertools.product([1, 2, 4], [1, 3, 5], [1, 3]):
        P, Q = rng.normal(size=(m, d_out, d)), rng.normal(size=(m, d, d))
        P2, _ = paper_from_heads(*heads_from_paper(P, Q))
        worst = max(worst, np.abs(P2 - P).max() / np.abs(P).max())
        n += 1
    print(f"paper -> heads -> paper         {n:4d} shapes   max relative error {worst:.2e}")


def torch_layer(rng):
    try:
        import torch
    except ImportError:
        print("torch rows skipped: install the torch extra")
        return
    from sklearn_linattn.nn import from_torch, to_torch

    worst, worst32, n = 0.0, 0.0, 0
    for readout, d_out, d_k, terms in itertools.product(
            ["last", "all"], [1, 2], [None, 1, 2], [False, True]):
        X = rng.normal(size=(300, 5, 3))
        V, Q = rng.normal(size=(2, d_out, 3)), rng.normal(size=(2, 3, 3))
        Y = mhla_forward(X, V, Q, readout=readout)
        if terms:
            x = X[:, -1] if readout == "last" else X
            Y = Y + rng.normal(size=d_out) + x @ rng.normal(size=(d_out, 3)).T
        model = LinearAttentionRegressor(readout, n_heads=2, fit_intercept=terms,
                                         fit_skip=terms, random_state=0).fit(X, Y)
        heads = from_torch(to_torch(model, d_k=d_k))
        worst = max(worst, relative(heads.value_matrices, heads.key_query_matrices,
                                    model.value_matrices_, model.key_query_matrices_))
        X_long = rng.normal(size=(50, 20, 3))
        pred = model.predict(X_long).reshape(50, -1)
        layer32 = to_torch(model, d_k=d_k, dtype=torch.float32)
        out = layer32(torch.as_tensor(X_long, dtype=torch.float32)).detach().double().numpy()
        worst32 = max(worst32, np.abs(out.reshape(50, -1) - pred).max() / np.abs(pred).max())
        n += 1
    print(f"estimator -> torch -> heads     {n:4d} fits     max relative error {worst:.2e}")
    print(f"float32 module vs predict       {n:4d} fits     max error / max |output| "
          f"{worst32:.2e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    projections(rng)
    paper(rng)
    torch_layer(rng)


if __name__ == "__main__":
    main()
