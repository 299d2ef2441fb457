"""HLO computations that several test files build programs from."""

# The (value, index) reducer of jnp.argmax over f32 with s32 indices: the larger value wins,
# a tie goes to the smaller index (XLA's and JAX's rule).
ARGMAX_REDUCER = """argmax {
  a = f32[] parameter(0)
  i = s32[] parameter(1)
  b = f32[] parameter(2)
  j = s32[] parameter(3)
  gt = pred[] compare(a, b), direction=GT
  eq = pred[] compare(a, b), direction=EQ
  lt = pred[] compare(i, j), direction=LT
  tie = pred[] and(eq, lt)
  pick = pred[] or(gt, tie)
  v = f32[] select(pick, a, b)
  k = s32[] select(pick, i, j)
  ROOT r = (f32[], s32[]) tuple(v, k)
}
"""
