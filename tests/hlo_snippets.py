"""HLO computations that several test files build programs from."""

from __future__ import annotations

from collections.abc import Sequence

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


def counted_loop_hlo(
    name: str,
    trips: int,
    carried: Sequence[tuple[str, str]],
    body: str,
    updates: Sequence[str],
    results: Sequence[str],
    reducers: str = "",
) -> str:
    """A module whose entry runs `for i in range(trips)` as a while loop over the state
    (i, *carried): `carried` is (name, type) per element after the counter, each an entry
    parameter in order and read by that name in the body; `body` holds the body's lines
    (they may read `i` and `i1` = i + 1), `updates` the names of the new values of the
    carried elements, in order; the entry returns the carried elements named in `results`
    (one: itself; several: a tuple). `reducers`: computations the body calls, placed first."""
    types = [t for _, t in carried]
    state = f"(s32[], {', '.join(types)})"
    index = {n: k + 1 for k, (n, _) in enumerate(carried)}
    reads = "\n".join(f"  {n} = {t} get-tuple-element(s), index={index[n]}" for n, t in carried)
    params = "\n".join(f"  {n} = {t} parameter({k})" for k, (n, t) in enumerate(carried))
    types_of = dict(carried)
    outs = [f"out_{n} = {types_of[n]} get-tuple-element(loop), index={index[n]}" for n in results]
    if len(results) == 1:
        tail = f"  ROOT {outs[0]}"
    else:
        out_types = ", ".join(types_of[n] for n in results)
        joined = ", ".join(f"out_{n}" for n in results)
        tail = "\n".join(f"  {o}" for o in outs) + f"\n  ROOT r = ({out_types}) tuple({joined})"
    names = ", ".join(n for n, _ in carried)
    return f"""HloModule {name}
{reducers}
cond {{
  s = {state} parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant({trips})
  ROOT c = pred[] compare(i, n), direction=LT
}}
body {{
  s = {state} parameter(0)
  i = s32[] get-tuple-element(s), index=0
{reads}
  loop_one = s32[] constant(1)
  i1 = s32[] add(i, loop_one)
{body}
  ROOT r = {state} tuple(i1, {", ".join(updates)})
}}
ENTRY e {{
{params}
  loop_zero = s32[] constant(0)
  loop_init = {state} tuple(loop_zero, {names})
  loop = {state} while(loop_init), condition=cond, body=body
{tail}
}}"""
