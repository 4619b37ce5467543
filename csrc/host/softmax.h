// Online softmax (base 2) and the log-sum-exp merge of split partials.
//
// Scores are kept in log2 units: s2 = (q . k) * sm_scale * log2(e), so the
// kernel uses exp2 (one ex2.approx) instead of exp. A row whose every score so
// far is masked has m = -inf; the helpers keep such rows NaN-free (they
// exponentiate against 0 instead of -inf) so a fully masked tile or split
// leaves l = 0 and O = 0 rather than NaN.
#pragma once

#include "common.h"

namespace va::host {

// The max to exponentiate against: m itself, or 0 while the row is all -inf
// (then every exp2(s - 0) with s = -inf is 0, not NaN).
VA_HD float softmax_ref_max(float m) { return m == neg_inf() ? 0.0f : m; }

// One online-softmax step for a row: the running max m becomes max(m, tile_max);
// returns alpha, the factor that rescales the old sum l and accumulator O.
// exp2 is passed in (ex2.approx on the device, exp2f on the host).
template <class Exp2>
VA_HD float online_softmax_update(float& m, float tile_max, Exp2 exp2) {
  const float m_new = m > tile_max ? m : tile_max;
  const float alpha = exp2(m - softmax_ref_max(m_new));  // m = -inf -> 0 (nothing to rescale)
  m = m_new;
  return alpha;
}

// Lazy variant (the v1 kernel): the reference max moves only when a tile's max exceeds it by more
// than `slack` (log2 units). Otherwise alpha = 1 exactly, nothing needs rescaling, and the row's
// probabilities exp2(s - m) stay <= 2^slack (l and O grow by at most that factor; fp32 holds it).
// Exact in real arithmetic: l and O share the reference max, and lse2 = m + log2(l) at the end.
template <class Exp2>
VA_HD float lazy_softmax_update(float& m, float tile_max, float slack, Exp2 exp2) {
  if (m != neg_inf() && tile_max <= m + slack) return 1.0f;
  return online_softmax_update(m, tile_max, exp2);
}

// log2-sum-exp2 of a finished row: m + log2(l), or -inf if nothing was visible.
template <class Log2>
// A NaN l (the row read a NaN or inf) stays NaN: a poisoned row must never look like one that saw nothing.
VA_HD float row_lse2(float m, float l, Log2 log2) { return l > 0.0f ? m + log2(l) : (l == 0.0f ? neg_inf() : l); }

// Reciprocal of l for the final normalisation; 0 for a row that saw nothing.
VA_HD float row_inv_l(float l) { return l > 0.0f ? 1.0f / l : (l == 0.0f ? 0.0f : l); }

// Running merge of normalised split partials (o_s, lse2_s):
//   out = sum_s w_s o_s / sum_s w_s,  w_s = exp2(lse2_s - m),  lse2 = m + log2(sum_s w_s).
// Each step updates (m, l) and returns the factors acc = acc * scale_old + o_s * scale_new.
struct MergeState {
  float m;  // running max of lse2_s (log2 units), -inf before the first split
  float l;  // sum of exp2(lse2_s - m)
};

VA_HD MergeState merge_init() { return {neg_inf(), 0.0f}; }

template <class Exp2>
VA_HD void lse_merge(MergeState& st, float lse2_s, float& scale_old, float& scale_new, Exp2 exp2) {
  if (lse2_s == neg_inf()) {  // the split saw no token of this row: weight 0
    scale_old = 1.0f;
    scale_new = 0.0f;
    return;
  }
  const float m_new = st.m > lse2_s ? st.m : lse2_s;
  scale_old = st.m == neg_inf() ? 0.0f : exp2(st.m - m_new);
  scale_new = exp2(lse2_s - m_new);
  st.l = st.l * scale_old + scale_new;
  st.m = m_new;
}

}  // namespace va::host
