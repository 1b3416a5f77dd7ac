"""The statistics a cross-validation split reads: each group's, projected or whole, and sums.

:func:`~._cv.cross_validated_scores` sums the groups of a split's train and
test parts.  On a rank-deficient design every group is read on a basis of
the row space of all the data (:class:`Projected`), formed from the kept
rows when there are any (:func:`projected_from_rows`), else from the group's
Gram matrix; otherwise the groups' statistics are summed as they are
(:class:`Whole`).
"""

import numpy as np

from ._features import features_matvec

__all__ = ["Projected", "Whole", "projected_from_rows", "summed"]


class Projected:
    """A group's statistics on a basis of the row space of all the data, and their sums.

    What a split reads of its parts: the Gram matrix and moment on the basis
    (``B^T G B``, ``B^T b``: every part's rows lie in that row space, so
    nothing is lost), the targets' moments, the counts, and the full Gram
    matrix's size and trace (the penalty's and the zero rule's).
    """

    _SUMMED = ("gram", "moment", "y_cross", "y_sum", "weight_sum", "n_rows", "trace")

    def __init__(self, stats=None, basis=None):
        if stats is None:
            return
        G = stats.gram
        self.gram = basis.T @ (G @ basis)
        self.gram = (self.gram + self.gram.T) / 2
        self.moment = basis.T @ stats.moment
        self.trace = float(np.trace(G))
        for name in ("y_cross", "y_sum", "weight_sum", "n_rows", "n_features", "dtype"):
            setattr(self, name, getattr(stats, name))

    def __add__(self, other):
        out = Projected()
        for name in self._SUMMED:
            setattr(out, name, getattr(self, name) + getattr(other, name))
        out.n_features = self.n_features
        out.dtype = np.result_type(self.dtype, other.dtype)
        return out


def projected_from_rows(stats, basis, rows, row_groups):
    """Every group's :class:`Projected` from the kept rows instead of its psi x psi Gram matrix.

    ``B^T G_g B`` is ``(W^1/2 Phi_g B)^T (W^1/2 Phi_g B)``: ``psi r`` per row
    rather than ``psi**2 r`` per group, and no Gram matrix expanded; the
    trace is the rows' weighted energy (``||S||**2 ||x||**2`` per row).
    """
    w = np.ones(rows.n_rows) if rows.w is None else np.asarray(rows.w, dtype=np.float64)
    Pw = features_matvec(rows.S, rows.x, np.ascontiguousarray(basis.T)) * np.sqrt(w)[:, None]
    energy = w * np.einsum("rp,rp->r", rows.S, rows.S) * np.einsum("rl,rl->r", rows.x, rows.x)
    out = []
    for g, part in enumerate(stats):
        sel = row_groups == g
        proj = Projected()
        proj.gram = Pw[sel].T @ Pw[sel]
        proj.moment = basis.T @ part.moment
        proj.trace = float(energy[sel].sum())
        for name in ("y_cross", "y_sum", "weight_sum", "n_rows", "n_features", "dtype"):
            setattr(proj, name, getattr(part, name))
        out.append(proj)
    return out


class Whole:
    """A group's statistics as they are (no basis), read as :class:`Projected` is."""

    def __init__(self, stats):
        self.stats = stats

    def __getattr__(self, name):
        return getattr(self.stats, name)

    @property
    def trace(self):
        return float(np.trace(self.stats.gram))

    def __add__(self, other):
        total = self.stats.restandardized(self.stats.standardizer)  # a copy
        total.merge(other.stats)
        return Whole(total)


def summed(parts, which):
    """The statistics of some groups together."""
    total = parts[which[0]]
    for i in which[1:]:
        total = total + parts[i]
    return total
