"""Slow, obviously-correct references for the package's vectorised math.

Everything here is written with plain Python loops over samples, tokens,
heads and indices, straight from the definition (doc/theory.rst), and uses nothing of the
package.  Sequences may be NaN-padded: every function takes the lengths
explicitly and never reads a token at or beyond ``lengths[i]``, so padding
values (NaN or zero) cannot matter.

Arithmetic is done on Python floats (IEEE double) whatever the input dtype,
so float32 input is treated as the exact values it stores.

Conventions
-----------
- ``X[i, t, :]`` is token t of sequence i (d entries); ``lengths[i]`` real tokens.
- ``V[h, a, j]``, ``Q[h, k, l]`` for head h.
- Folded pair p runs over ``(j, k)`` with ``j <= k`` row by row
  (``(0,0), (0,1), ..., (0,d-1), (1,1), ...``); feature index ``p * d + l``.
"""

import math

import numpy as np


def ref_pairs(d):
    """Folded pairs (j, k), j <= k, in feature order, by two nested loops."""
    pairs = []
    for j in range(d):
        for k in range(j, d):
            pairs.append((j, k))
    return pairs


def ref_n_features(d):
    """psi = number of (pair, l) combinations, counted."""
    return len(ref_pairs(d)) * d


def ref_lengths(X):
    """Number of real tokens per sequence: count rows until the first all-NaN row.

    Only meant for arrays that satisfy the padding rule.
    """
    n_samples, n_tokens, d = X.shape
    lengths = []
    for i in range(n_samples):
        n = 0
        for t in range(n_tokens):
            if all(math.isnan(float(X[i, t, c])) for c in range(d)):
                break
            n += 1
        lengths.append(n)
    return lengths


def _second_moment(X, i, n, decay=1.0):
    """S = sum_{t < n} decay**(n - 1 - t) x_t x_t^T of sequence i, as a list of lists."""
    d = X.shape[2]
    S = [[0.0] * d for _ in range(d)]
    for t in range(n):
        weight = float(decay) ** (n - 1 - t)
        for j in range(d):
            for k in range(d):
                S[j][k] += weight * float(X[i, t, j]) * float(X[i, t, k])
    return S


def _features_of_prefix(X, i, n, decay=1.0):
    """H of the first n tokens of sequence i: S[j,k] * x_{n-1}[l] (S decayed)."""
    d = X.shape[2]
    S = _second_moment(X, i, n, decay)
    out = []
    for j, k in ref_pairs(d):
        for l in range(d):
            out.append(S[j][k] * float(X[i, n - 1, l]))
    return out


def ref_features(X, lengths):
    """H(X_i) for every sequence: array of shape (n_samples, psi)."""
    return np.array(
        [_features_of_prefix(X, i, lengths[i]) for i in range(X.shape[0])],
        dtype=np.float64,
    ).reshape(X.shape[0], ref_n_features(X.shape[2]))


def ref_decayed_features(X, lengths, decays):
    """The feature blocks of every decay side by side, by loops: (n_samples, K * psi)."""
    return np.array(
        [[v for g in decays for v in _features_of_prefix(X, i, lengths[i], g)]
         for i in range(X.shape[0])], dtype=np.float64,
    ).reshape(X.shape[0], len(decays) * ref_n_features(X.shape[2]))


def ref_decayed_prefix_features(X, lengths, decays):
    """Decayed feature blocks of every prefix: (n_samples, n_tokens, K * psi), zero at padding."""
    n_samples, n_tokens, d = X.shape
    out = np.zeros((n_samples, n_tokens, len(decays) * ref_n_features(d)))
    for i in range(n_samples):
        for t in range(lengths[i]):
            out[i, t] = [v for g in decays for v in _features_of_prefix(X, i, t + 1, g)]
    return out


def ref_prefix_features(X, lengths):
    """H of every prefix: shape (n_samples, n_tokens, psi), zero rows at padding."""
    n_samples, n_tokens, d = X.shape
    out = np.zeros((n_samples, n_tokens, ref_n_features(d)))
    for i in range(n_samples):
        for t in range(lengths[i]):
            out[i, t] = _features_of_prefix(X, i, t + 1)
    return out


def ref_kernel(X, lengths_X, Y, lengths_Y):
    """<H(X_i), H(Y_j)> as the plain dot product of reference features."""
    HX = ref_features(X, lengths_X)
    HY = ref_features(Y, lengths_Y)
    K = np.zeros((HX.shape[0], HY.shape[0]))
    for a in range(HX.shape[0]):
        for b in range(HY.shape[0]):
            total = 0.0
            for p in range(HX.shape[1]):
                total += HX[a, p] * HY[b, p]
            K[a, b] = total
    return K


def ref_feature_names(d, input_features=None):
    """Names "S[xj,xk]*last[xl]" in feature order."""
    names = input_features or [f"x{c}" for c in range(d)]
    out = []
    for j, k in ref_pairs(d):
        for l in range(d):
            out.append(f"S[{names[j]},{names[k]}]*last[{names[l]}]")
    return out


def _attention_output(X, i, n, V, Q):
    """sum_h V_h sum_{t < n} x_t (x_t^T Q_h x_{n-1}) for sequence i, list of d_out."""
    n_heads, d_out, d = V.shape
    x_last = [float(X[i, n - 1, c]) for c in range(d)]
    y = [0.0] * d_out
    for h in range(n_heads):
        for t in range(n):
            x_t = [float(X[i, t, c]) for c in range(d)]
            score = 0.0
            for k in range(d):
                for l in range(d):
                    score += x_t[k] * float(Q[h, k, l]) * x_last[l]
            for a in range(d_out):
                for j in range(d):
                    y[a] += float(V[h, a, j]) * x_t[j] * score
    return y


def ref_forward(X, lengths, V, Q, readout="last"):
    """MHLA output by loops.

    Returns shape (n_samples, d_out) for ``"last"``; (n_samples, n_tokens,
    d_out) with NaN at padded positions for ``"all"`` (output at position t
    is the attention over the prefix of t + 1 tokens).
    """
    n_samples, n_tokens, _ = X.shape
    d_out = V.shape[1]
    if readout == "last":
        return np.array(
            [_attention_output(X, i, lengths[i], V, Q) for i in range(n_samples)],
            dtype=np.float64,
        ).reshape(n_samples, d_out)
    if readout != "all":
        raise ValueError(readout)
    out = np.full((n_samples, n_tokens, d_out), np.nan)
    for i in range(n_samples):
        for t in range(lengths[i]):
            out[i, t] = _attention_output(X, i, t + 1, V, Q)
    return out


def ref_coefficients(V, Q):
    """p(Theta) by the formula of doc/theory.rst, shape (d_out, psi).

    For j < k: sum_h V_h[a,j] Q_h[k,l] + V_h[a,k] Q_h[j,l];
    for j == k: sum_h V_h[a,j] Q_h[j,l].
    """
    n_heads, d_out, d = V.shape
    pairs = ref_pairs(d)
    coef = np.zeros((d_out, len(pairs) * d))
    for a in range(d_out):
        for p, (j, k) in enumerate(pairs):
            for l in range(d):
                total = 0.0
                for h in range(n_heads):
                    if j < k:
                        total += float(V[h, a, j]) * float(Q[h, k, l])
                        total += float(V[h, a, k]) * float(Q[h, j, l])
                    else:
                        total += float(V[h, a, j]) * float(Q[h, j, l])
                coef[a, p * d + l] = total
    return coef


def _parameter_jacobian(f, V, Q):
    """Columns df/dtheta_i (V then Q, flattened) by central differences, one entry at a time.

    f is linear in each single entry of V or Q (the model is bilinear), so the
    difference quotient is the derivative up to rounding for any step.
    """
    theta = np.concatenate([V.ravel(), Q.ravel()])
    nV = V.size
    columns = []
    for i in range(theta.size):
        parts = []
        for sign in (1.0, -1.0):
            t = theta.copy()
            t[i] += sign
            parts.append(np.ravel(f(t[:nV].reshape(V.shape), t[nV:].reshape(Q.shape))))
        columns.append((parts[0] - parts[1]) / 2.0)
    return np.array(columns).T


def _numerical_rank(M, rtol):
    s = np.linalg.svd(M, compute_uv=False) if M.size else np.zeros(0)
    return int(np.sum(s > rtol * s[0])) if s.size and s[0] > 0 else 0


def ref_local_ranks(X, lengths, V, Q, readout="last", rtol=1e-8):
    """(tangent rank, data rank, generic rank) of heads on sequences, from their definitions.

    The tangent rank is the rank of dp/dtheta (p = ref_coefficients), the
    data rank that of d(outputs)/dtheta on the real rows (ref_forward), the
    generic rank that of dp/dtheta at random heads of the same shape.  Ranks
    count singular values above ``rtol`` times the largest: meant for
    well-scaled cases whose ranks are clear-cut.
    """
    Jp = _parameter_jacobian(ref_coefficients, V, Q)

    def outputs(V, Q):
        Y = ref_forward(X, lengths, V, Q, readout)
        return Y if readout == "last" else Y[~np.isnan(Y[:, :, 0])]

    Jy = _parameter_jacobian(outputs, V, Q)
    rng = np.random.default_rng(12345)
    Jg = _parameter_jacobian(ref_coefficients, rng.normal(size=V.shape),
                             rng.normal(size=Q.shape))
    return _numerical_rank(Jp, rtol), _numerical_rank(Jy, rtol), _numerical_rank(Jg, rtol)


def ref_fold(C):
    """Fold C[a, j, k, l] into (d_out, psi): C[a,j,k,l] + C[a,k,j,l] for j < k."""
    d_out, d = C.shape[0], C.shape[1]
    pairs = ref_pairs(d)
    coef = np.zeros((d_out, len(pairs) * d))
    for a in range(d_out):
        for p, (j, k) in enumerate(pairs):
            for l in range(d):
                if j < k:
                    coef[a, p * d + l] = float(C[a, j, k, l]) + float(C[a, k, j, l])
                else:
                    coef[a, p * d + l] = float(C[a, j, j, l])
    return coef


def ref_unfold(coef, d):
    """Symmetric split: C[a,j,k,l] = C[a,k,j,l] = c/2 for j < k, C[a,j,j,l] = c."""
    d_out = coef.shape[0]
    C = np.zeros((d_out, d, d, d))
    for a in range(d_out):
        for p, (j, k) in enumerate(ref_pairs(d)):
            for l in range(d):
                c = float(coef[a, p * d + l])
                if j < k:
                    C[a, j, k, l] = c / 2
                    C[a, k, j, l] = c / 2
                else:
                    C[a, j, j, l] = c
    return C


def ref_linear_readout(coef, H):
    """<coef[a], H[..., :]> for every row of H, by a loop over features."""
    H = np.asarray(H, dtype=np.float64)
    lead = H.shape[:-1]
    rows = H.reshape(-1, H.shape[-1])
    out = np.zeros((rows.shape[0], coef.shape[0]))
    for r in range(rows.shape[0]):
        for a in range(coef.shape[0]):
            total = 0.0
            for p in range(rows.shape[1]):
                total += float(coef[a, p]) * rows[r, p]
            out[r, a] = total
    return out.reshape(*lead, coef.shape[0])


def random_generator(rng, d, d_out=1, n_heads=1):
    """Random heads (V, Q) with N(0, 1/d) entries, the paper's Sec. 4.1 scale."""
    V = rng.normal(size=(n_heads, d_out, d)) / np.sqrt(d)
    Q = rng.normal(size=(n_heads, d, d)) / np.sqrt(d)
    return V, Q


def ref_generate(X, lengths, V, Q, n_steps, rounding=None):
    """Autoregressive generation by loops: recompute the whole attention each step.

    ``rounding`` is None, or a table (n_vocab, d): the nearest row (first on ties).
    """
    n_samples, n_tokens, d = X.shape
    out = np.full((n_samples, n_tokens + n_steps, d), np.nan)
    for i in range(n_samples):
        seq = [[float(X[i, t, c]) for c in range(d)] for t in range(lengths[i])]
        for _ in range(n_steps):
            arr = np.array(seq)[None]
            y = _attention_output(arr, 0, len(seq), V, Q)
            if rounding is not None:
                best, best_dist = 0, math.inf
                for v in range(len(rounding)):
                    dist = sum((y[c] - float(rounding[v][c])) ** 2 for c in range(d))
                    if dist < best_dist:
                        best, best_dist = v, dist
                y = [float(rounding[best][c]) for c in range(d)]
            seq.append(list(y))
        for t, token in enumerate(seq):
            out[i, t] = token
    return out


def ref_run_dfa(transitions, words, start=0):
    """States visited by each automaton on its word (-1 ends a word), by loops."""
    transitions = np.asarray(transitions)
    words = np.asarray(words)
    n, length = words.shape
    states = np.full((n, length + 1), -1, dtype=np.int64)
    for i in range(n):
        s = start
        states[i, 0] = s
        for t in range(length):
            if words[i, t] < 0:
                break
            s = int(transitions[i, s, words[i, t]])
            states[i, t + 1] = s
    return states


def ref_next_token_pairs(sequences, lengths, start):
    """(prefix, next token, sequence index) for every predicted position, by loops."""
    pairs = []
    for i in range(len(sequences)):
        for t in range(int(start[i]), int(lengths[i])):
            pairs.append((np.array(sequences[i, :t]), np.array(sequences[i, t]), i))
    return pairs


def ref_run_turing_machine(next_state, write, move, tapes, n_steps):
    """States, heads and tapes of bounded-tape Turing machines, by loops (head clamps at the ends)."""
    n, T = np.asarray(tapes).shape
    states = np.zeros((n, n_steps + 1), dtype=np.int64)
    heads = np.zeros((n, n_steps + 1), dtype=np.int64)
    history = np.zeros((n, n_steps + 1, T), dtype=np.int64)
    for i in range(n):
        q, h, tape = 0, 0, [int(c) for c in tapes[i]]
        history[i, 0] = tape
        for t in range(n_steps):
            g = tape[h]
            tape[h] = int(write[i][q][g])
            h = min(max(h + int(move[i][q][g]), 0), T - 1)
            q = int(next_state[i][q][g])
            states[i, t + 1], heads[i, t + 1] = q, h
            history[i, t + 1] = tape
    return states, heads, history
