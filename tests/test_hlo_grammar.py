# ruff: noqa: E501  (table modules are written with lines as long as XLA prints them)
"""HLO grammar tables: each row one construct of XLA's text format, written for xlapy from
the facts of XLA's parser (xla/hlo/parser/hlo_parser.cc) and its tests.

  LONG    modules in XLA's long form (`%` names, signatures, operand shapes), which must
          parse and print back byte-identical with LONG_OPTIONS
  SHORT   modules in the short form JAX's `as_text()` prints, byte-identical with short()
  READS   text XLA accepts but does not print that way: it must parse, verify, and print
          the canonical text given in the row (which itself round-trips)
  REFUSES text XLA refuses: parse (and verify) must raise an xlapy error with the message
"""

import pytest

from xlapy.errors import XlapyError
from xlapy.ir.parser import parse_module
from xlapy.ir.printer import PrintOptions, print_module
from xlapy.ir.verifier import verify

LONG_OPTIONS = PrintOptions.verbose()

ADD_F32 = """%sum (sum.x: f32[], sum.y: f32[]) -> f32[] {
  %sum.x = f32[] parameter(0)
  %sum.y = f32[] parameter(1)
  ROOT %sum.s = f32[] add(f32[] %sum.x, f32[] %sum.y)
}
"""

ADD_SHORT = """sum {
  sum.x = f32[] parameter(0)
  sum.y = f32[] parameter(1)
  ROOT sum.s = f32[] add(sum.x, sum.y)
}
"""

GE_F32 = """%ge (ge.a: f32[], ge.b: f32[]) -> pred[] {
  %ge.a = f32[] parameter(0)
  %ge.b = f32[] parameter(1)
  ROOT %ge.c = pred[] compare(f32[] %ge.a, f32[] %ge.b), direction=GE
}
"""


def long(name: str, layout: str, body: str, *comps: str, header: str = "") -> str:
    """A long-form module: header with entry_computation_layout, computations, entry."""
    parts = [f"HloModule {name}, entry_computation_layout={{{layout}}}{header}\n"]
    parts += [c for c in comps]
    parts.append(body)
    return "\n".join(parts)


LONG = {
    "scaled_sum": long(
        "scaled_sum",
        "(f32[], f32[3,2]{1,0})->f32[3,2]{1,0}",
        """ENTRY %main (s: f32[], u: f32[3,2]) -> f32[3,2] {
  %s = f32[] parameter(0)
  %b = f32[3,2]{1,0} broadcast(f32[] %s), dimensions={}
  %u = f32[3,2]{1,0} parameter(1)
  ROOT %m = f32[3,2]{1,0} multiply(f32[3,2]{1,0} %b, f32[3,2]{1,0} %u)
}
""",
    ),
    "pred_matrix": long(
        "pred_matrix",
        "()->pred[2,3]{1,0}",
        """ENTRY %main () -> pred[2,3] {
  ROOT %c = pred[2,3]{1,0} constant({ { 1, 0, 1 }, { 0, 0, 1 } })
}
""",
    ),
    "half_floats": long(
        "half_floats",
        "()->(f16[], bf16[], f16[2]{0})",
        """ENTRY %main () -> (f16[], bf16[], f16[2]) {
  %h = f16[] constant(500)
  %b = bf16[] constant(500)
  %v = f16[2]{0} constant({0.25, -65504})
  ROOT %t = (f16[], bf16[], f16[2]{0}) tuple(f16[] %h, bf16[] %b, f16[2]{0} %v)
}
""",
    ),
    "rank4_constant": long(
        "rank4_constant",
        "()->f32[2,1,2,2]{3,2,1,0}",
        """ENTRY %main () -> f32[2,1,2,2] {
  ROOT %c = f32[2,1,2,2]{3,2,1,0} constant({ { /*i0=0*/ { /*i1=0*/ { 1, 2 }, { 3, 4 } } }, { /*i0=1*/ { /*i1=0*/ { 5, 6 }, { 7, 8 } } } })
}
""",
    ),
    "rank4_empty": long(
        "rank4_empty",
        "()->f32[2,0,3,1]{3,2,1,0}",
        """ENTRY %main () -> f32[2,0,3,1] {
  ROOT %c = f32[2,0,3,1]{3,2,1,0} constant({ { /*i0=0*/ }, { /*i0=1*/ } })
}
""",
    ),
    "rank3_constant": long(
        "rank3_constant",
        "()->s32[2,1,3]{2,1,0}",
        """ENTRY %main () -> s32[2,1,3] {
  ROOT %c = s32[2,1,3]{2,1,0} constant({ { { 1, 2, 3 } }, { { 4, 5, 6 } } })
}
""",
    ),
    "column_constant": long(
        "column_constant",
        "()->(f32[2,1]{1,0}, f32[2]{0})",
        """ENTRY %main () -> (f32[2,1], f32[2]) {
  ROOT %c = (f32[2,1]{1,0}, f32[2]{0}) constant(( { {1}, {2.5} }, {3, 40} ))
}
""",
    ),
    "non_finite": long(
        "non_finite",
        "()->pred[4]{0}",
        """ENTRY %main () -> pred[4] {
  %c = f32[4]{0} constant({nan, -inf, inf, -nan})
  ROOT %f = pred[4]{0} is-finite(f32[4]{0} %c)
}
""",
    ),
    "f8_constant": long(
        "f8_constant",
        "()->f8e4m3fn[3]{0}",
        """ENTRY %main () -> f8e4m3fn[3] {
  ROOT %c = f8e4m3fn[3]{0} constant({nan, 6, -0.5})
}
""",
    ),
    "u64_limits": long(
        "u64_limits",
        "()->(u64[], s64[])",
        """ENTRY %main () -> (u64[], s64[]) {
  %u = u64[] constant(18446744073709551615)
  %s = s64[] constant(-9223372036854775808)
  ROOT %t = (u64[], s64[]) tuple(u64[] %u, s64[] %s)
}
""",
    ),
    "strided_slice": long(
        "strided_slice",
        "(f32[4,6]{1,0})->f32[2,6]{1,0}",
        """ENTRY %main (p: f32[4,6]) -> f32[2,6] {
  %p = f32[4,6]{1,0} parameter(0)
  ROOT %s = f32[2,6]{1,0} slice(f32[4,6]{1,0} %p), slice={[0:4:2], [0:6:1]}
}
""",
    ),
    "escaped_strings": long(
        "escaped_strings",
        "()->s32[]",
        """ENTRY %main () -> s32[] {
  ROOT %c = s32[] constant(7), metadata={op_type="k" op_name="\\"q\\" it\\'s\\n" source_file="a/b.py" source_line=12}, backend_config="x\\" y"
}
""",
    ),
    "scalar_memory_space": long(
        "scalar_memory_space",
        "(u32[]{:S(2)}, f32[4]{0:T(2)S(1)})->u32[]{:S(2)}",
        """ENTRY %main (p: u32[], q: f32[4]) -> u32[] {
  %q = f32[4]{0:T(2)S(1)} parameter(1)
  ROOT %p = u32[]{:S(2)} parameter(0)
}
""",
    ),
    "scalar_reduce_window": long(
        "scalar_reduce_window",
        "()->f32[]",
        """ENTRY %main () -> f32[] {
  %x = f32[] constant(3)
  %i = f32[] constant(0)
  ROOT %rw = f32[] reduce-window(f32[] %x, f32[] %i), to_apply=%sum
}
""",
        ADD_F32,
    ),
    "scalar_select_and_scatter": long(
        "scalar_select_and_scatter",
        "()->f32[]",
        """ENTRY %main () -> f32[] {
  %o = f32[] constant(1)
  %s = f32[] constant(2)
  %i = f32[] constant(0)
  ROOT %r = f32[] select-and-scatter(f32[] %o, f32[] %s, f32[] %i), select=%ge, scatter=%sum
}
""",
        GE_F32,
        ADD_F32,
    ),
    "custom_call_literal": long(
        "custom_call_literal",
        "()->f32[2]{0}",
        """ENTRY %main () -> f32[2] {
  %c = f32[1]{0} constant({5})
  ROOT %cc = f32[2]{0} custom-call(f32[1]{0} %c), custom_call_target="t", literal=s32[2]{0} {3, 4}
}
""",
    ),
    "custom_call_tuple_literal": long(
        "custom_call_tuple_literal",
        "()->f32[2]{0}",
        """ENTRY %main () -> f32[2] {
  ROOT %cc = f32[2]{0} custom-call(), custom_call_target="t", literal=( s32[2]{0} {3, 4}, pred[3]{0} {1, 0, 1}, f32[] 0.1 )
}
""",
    ),
    "custom_call_everything": long(
        "custom_call_everything",
        "(f32[4,2]{0,1})->(f32[4,2]{1,0}, s8[16]{0})",
        """ENTRY %main (p: f32[4,2]) -> (f32[4,2], s8[16]) {
  %p = f32[4,2]{0,1} parameter(0)
  ROOT %cc = (f32[4,2]{1,0}, s8[16]{0}) custom-call(f32[4,2]{0,1} %p), custom_call_target="my\\"fn", operand_layout_constraints={f32[4,2]{1,0}}, custom_call_has_side_effect=true, output_to_operand_aliasing={{0}: (0, {})}, schedule=SCHEDULE_LATEST, api_version=API_VERSION_TYPED_FFI, backend_config={key = 1 : i32}
}
""",
    ),
    "async_custom_call_sugar": long(
        "async_custom_call_sugar",
        "(f32[10]{0})->f32[20]{0}",
        """ENTRY %main (p0: f32[10]) -> f32[20] {
  %p0 = f32[10]{0} parameter(0)
  %s = ((f32[10]{0}), f32[20]{0}, s32[]) custom-call-start(f32[10]{0} %p0), async_execution_thread="side", custom_call_target="foo"
  %u = ((f32[10]{0}), f32[20]{0}, s32[]) custom-call-update(((f32[10]{0}), f32[20]{0}, s32[]) %s)
  ROOT %d = f32[20]{0} custom-call-done(((f32[10]{0}), f32[20]{0}, s32[]) %u)
}
""",
    ),
    "async_wrapping_two_ops": long(
        "async_wrapping_two_ops",
        "(f32[4]{0})->f32[4]{0}",
        """ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %s = ((f32[4]{0}), f32[4]{0}, s32[]) async-start(f32[4]{0} %p), calls=%work
  ROOT %d = f32[4]{0} async-done(((f32[4]{0}), f32[4]{0}, s32[]) %s)
}
""",
        """%work (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %n = f32[4]{0} negate(f32[4]{0} %a)
  ROOT %e = f32[4]{0} exponential(f32[4]{0} %n)
}
""",
    ),
    "conv_precision": long(
        "conv_precision",
        "(f32[1,2,1]{2,1,0}, f32[1,1,1]{2,1,0})->f32[1,2,1]{2,0,1}",
        """ENTRY %main (x: f32[1,2,1], k: f32[1,1,1]) -> f32[1,2,1] {
  %x = f32[1,2,1]{2,1,0} parameter(0)
  %k = f32[1,1,1]{2,1,0} parameter(1)
  ROOT %y = f32[1,2,1]{2,0,1} convolution(f32[1,2,1]{2,1,0} %x, f32[1,1,1]{2,1,0} %k), window={size=1}, dim_labels=b0f_0io->b0f, operand_precision={high,default}
}
""",
    ),
    "conv_dilated": long(
        "conv_dilated",
        "(f32[2,5,5,3]{3,2,1,0}, f32[3,3,3,4]{3,2,1,0})->f32[2,10,10,4]{3,2,1,0}",
        """ENTRY %main (x: f32[2,5,5,3], k: f32[3,3,3,4]) -> f32[2,10,10,4] {
  %x = f32[2,5,5,3]{3,2,1,0} parameter(0)
  %k = f32[3,3,3,4]{3,2,1,0} parameter(1)
  ROOT %y = f32[2,10,10,4]{3,2,1,0} convolution(f32[2,5,5,3]{3,2,1,0} %x, f32[3,3,3,4]{3,2,1,0} %k), window={size=3x3 pad=1_2x1_2 lhs_dilate=2x2 rhs_reversal=1x1}, dim_labels=b01f_01io->b01f
}
""",
    ),
    "pad_interior_negative": long(
        "pad_interior_negative",
        "(f32[1,4,7]{2,1,0})->f32[1,2,17]{2,1,0}",
        """ENTRY %main (x: f32[1,4,7]) -> f32[1,2,17] {
  %x = f32[1,4,7]{2,1,0} parameter(0)
  %z = f32[] constant(-5.123)
  ROOT %p = f32[1,2,17]{2,1,0} pad(f32[1,4,7]{2,1,0} %x, f32[] %z), padding=0_0_0x-1_-1_0x2_2_1
}
""",
    ),
    "gather_batched": long(
        "gather_batched",
        "(f32[8,5,3]{2,1,0}, s32[8,2,1]{2,1,0})->f32[8,2,2,3]{3,2,1,0}",
        """ENTRY %main (x: f32[8,5,3], i: s32[8,2,1]) -> f32[8,2,2,3] {
  %x = f32[8,5,3]{2,1,0} parameter(0)
  %i = s32[8,2,1]{2,1,0} parameter(1)
  ROOT %g = f32[8,2,2,3]{3,2,1,0} gather(f32[8,5,3]{2,1,0} %x, s32[8,2,1]{2,1,0} %i), offset_dims={2,3}, collapsed_slice_dims={}, start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,2,3}, indices_are_sorted=true
}
""",
    ),
    "scatter_unique": long(
        "scatter_unique",
        "(f32[5,3]{1,0}, s32[2,1]{1,0}, f32[2,3]{1,0})->f32[5,3]{1,0}",
        """ENTRY %main (x: f32[5,3], i: s32[2,1], u: f32[2,3]) -> f32[5,3] {
  %x = f32[5,3]{1,0} parameter(0)
  %i = s32[2,1]{1,0} parameter(1)
  %u = f32[2,3]{1,0} parameter(2)
  ROOT %s = f32[5,3]{1,0} scatter(f32[5,3]{1,0} %x, s32[2,1]{1,0} %i, f32[2,3]{1,0} %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, indices_are_sorted=true, unique_indices=true, to_apply=%sum
}
""",
        ADD_F32,
    ),
    "six_operand_tuple": long(
        "six_operand_tuple",
        "(f32[])->(f32[], f32[], f32[], f32[], f32[], /*index=5*/f32[])",
        """ENTRY %main (v: f32[]) -> (f32[], f32[], f32[], f32[], f32[], /*index=5*/f32[]) {
  %v = f32[] parameter(0)
  ROOT %t = (f32[], f32[], f32[], f32[], f32[], /*index=5*/f32[]) tuple(f32[] %v, f32[] %v, f32[] %v, f32[] %v, f32[] %v, /*index=5*/f32[] %v)
}
""",
    ),
    "copy_start_memory_spaces": long(
        "copy_start_memory_spaces",
        "(f32[2,3]{1,0:S(1)})->f32[2,3]{1,0:S(2)}",
        """ENTRY %main (v: f32[2,3]) -> f32[2,3] {
  %v = f32[2,3]{1,0:S(1)} parameter(0)
  %cs = (f32[2,3]{1,0:S(2)}, f32[2,3]{1,0:S(1)}, u32[]) copy-start(f32[2,3]{1,0:S(1)} %v), cross_program_prefetch_index=0
  ROOT %cd = f32[2,3]{1,0:S(2)} copy-done((f32[2,3]{1,0:S(2)}, f32[2,3]{1,0:S(1)}, u32[]) %cs)
}
""",
    ),
    "send_recv_host": long(
        "send_recv_host",
        "()->(f32[], token[])",
        """ENTRY %main () -> (f32[], token[]) {
  %tok = token[] after-all()
  %r = (f32[], u32[], token[]) recv(token[] %tok), channel_id=3, is_host_transfer=true
  ROOT %rd = (f32[], token[]) recv-done((f32[], u32[], token[]) %r), channel_id=3, is_host_transfer=true
  %c = f32[] constant(2.5), sharding={maximal device=0}
  %s = (f32[], u32[], token[]) send(f32[] %c, token[] %tok), channel_id=4, control-predecessors={%r}
  %sd = token[] send-done((f32[], u32[], token[]) %s), channel_id=4
}
""",
    ),
    "mesh_replica_groups": long(
        "mesh_replica_groups",
        "(f32[8]{0})->f32[16]{0}",
        """ENTRY %main (p: f32[8]) -> f32[16] {
  %p = f32[8]{0} parameter(0)
  ROOT %ag = f32[16]{0} all-gather(f32[8]{0} %p), channel_id=1, replica_groups=mesh['x'=2,'y'=2] {'y'}, dimensions={0}, use_global_device_ids=true
}
""",
        header=", num_partitions=4",
    ),
    "iota_replica_groups": long(
        "iota_replica_groups",
        "(f32[8]{0})->f32[8]{0}",
        """ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %ar = f32[8]{0} all-reduce(f32[8]{0} %p), channel_id=1, replica_groups=[2,2]<=[2,2]T(1,0), use_global_device_ids=true, to_apply=%sum
}
""",
        ADD_F32,
        header=", num_partitions=4",
    ),
    "collective_permute_combined": long(
        "collective_permute_combined",
        "(f32[4]{0}, f32[2]{0})->(f32[4]{0}, f32[2]{0})",
        """ENTRY %main (a: f32[4], b: f32[2]) -> (f32[4], f32[2]) {
  %a = f32[4]{0} parameter(0)
  %b = f32[2]{0} parameter(1)
  ROOT %cp = (f32[4]{0}, f32[2]{0}) collective-permute(f32[4]{0} %a, f32[2]{0} %b), channel_id=1, source_target_pairs={{0,1},{1,0}}
}
""",
        header=", replica_count=2",
    ),
    "collective_permute_in_place": long(
        "collective_permute_in_place",
        "(f32[4]{0}, f32[4]{0})->f32[4]{0}",
        """ENTRY %main (a: f32[4], o: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %o = f32[4]{0} parameter(1)
  %z = s32[] constant(0)
  %i = (s32[]) tuple(s32[] %z)
  ROOT %cp = f32[4]{0} collective-permute(f32[4]{0} %a, f32[4]{0} %o, (s32[]) %i, (s32[]) %i), source_target_pairs={{0,1},{1,0}}, slice_sizes={{2}}
}
""",
        header=", replica_count=2",
    ),
    "all_to_all_tuple": long(
        "all_to_all_tuple",
        "(f32[4]{0}, f32[4]{0})->(f32[4]{0}, f32[4]{0})",
        """ENTRY %main (a: f32[4], b: f32[4]) -> (f32[4], f32[4]) {
  %a = f32[4]{0} parameter(0)
  %b = f32[4]{0} parameter(1)
  ROOT %t = (f32[4]{0}, f32[4]{0}) all-to-all(f32[4]{0} %a, f32[4]{0} %b), replica_groups={{0,1}}
}
""",
        header=", replica_count=2",
    ),
    "while_loop": long(
        "while_loop",
        "()->s32[]",
        """ENTRY %main () -> s32[] {
  %c0 = s32[] constant(0)
  ROOT %w = s32[] while(s32[] %c0), condition=%cond, body=%body
}
""",
        """%body (b: s32[]) -> s32[] {
  %one = s32[] constant(1)
  %b = s32[] parameter(0)
  ROOT %next = s32[] add(s32[] %one, s32[] %b)
}
""",
        """%cond (c: s32[]) -> pred[] {
  %five = s32[] constant(5)
  %c = s32[] parameter(0)
  ROOT %lt = pred[] compare(s32[] %c, s32[] %five), direction=LT
}
""",
    ),
    "fusion_aliasing": long(
        "fusion_aliasing",
        "(f32[2]{0}, f32[2]{0})->f32[2]{0}",
        """ENTRY %main (a: f32[2], b: f32[2]) -> f32[2] {
  %a = f32[2]{0} parameter(0)
  %b = f32[2]{0} parameter(1)
  ROOT %f = f32[2]{0} fusion(f32[2]{0} %a, f32[2]{0} %b), kind=kLoop, output_to_operand_aliasing={{}: (0, {})}, calls=%fused
}
""",
        """%fused (p0: f32[2], p1: f32[2]) -> f32[2] {
  %p0 = f32[2]{0} parameter(0)
  %p1 = f32[2]{0} parameter(1)
  ROOT %m = f32[2]{0} multiply(f32[2]{0} %p0, f32[2]{0} %p1)
}
""",
    ),
    "rng_and_fft": long(
        "rng_and_fft",
        "(u64[2]{0}, c64[4,8]{1,0})->((u64[2]{0}, u32[3]{0}), c64[4,8]{1,0})",
        """ENTRY %main (s: u64[2], x: c64[4,8]) -> ((u64[2], u32[3]), c64[4,8]) {
  %s = u64[2]{0} parameter(0)
  %r = (u64[2]{0}, u32[3]{0}) rng-bit-generator(u64[2]{0} %s), algorithm=rng_philox
  %x = c64[4,8]{1,0} parameter(1)
  %f = c64[4,8]{1,0} fft(c64[4,8]{1,0} %x), fft_type=IFFT, fft_length={8}
  ROOT %t = ((u64[2]{0}, u32[3]{0}), c64[4,8]{1,0}) tuple((u64[2]{0}, u32[3]{0}) %r, c64[4,8]{1,0} %f)
}
""",
    ),
    "triangular_solve_and_sort": long(
        "triangular_solve_and_sort",
        "(f32[3,3]{1,0}, f32[2,3]{1,0})->f32[2,3]{1,0}",
        """ENTRY %main (a: f32[3,3], b: f32[2,3]) -> f32[2,3] {
  %a = f32[3,3]{1,0} parameter(0)
  %b = f32[2,3]{1,0} parameter(1)
  %x = f32[2,3]{1,0} triangular-solve(f32[3,3]{1,0} %a, f32[2,3]{1,0} %b), lower=true, transpose_a=NO_TRANSPOSE
  ROOT %s = f32[2,3]{1,0} sort(f32[2,3]{1,0} %x), dimensions={1}, is_stable=true, to_apply=%lt
}
""",
        """%lt (l: f32[], r: f32[]) -> pred[] {
  %l = f32[] parameter(0)
  %r = f32[] parameter(1)
  ROOT %c = pred[] compare(f32[] %l, f32[] %r), direction=LT, type=TOTALORDER
}
""",
    ),
    "sharding_forms": long(
        "sharding_forms",
        "(f32[4,4]{1,0}, f32[4]{0})->(f32[4,4]{1,0}, f32[4]{0})",
        """ENTRY %main (a: f32[4,4], b: f32[4]) -> (f32[4,4], f32[4]) {
  %a = f32[4,4]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}
  %b = f32[4]{0} parameter(1), sharding={devices=[2,2]0,2,1,3 last_tile_dim_replicate}
  ROOT %t = (f32[4,4]{1,0}, f32[4]{0}) tuple(f32[4,4]{1,0} %a, f32[4]{0} %b), sharding={{replicated}, {manual}}
}
""",
        header=", num_partitions=4",
    ),
    "composite_call": long(
        "composite_call",
        "()->f32[]",
        """ENTRY %main () -> f32[] {
  %c = f32[] constant(42)
  ROOT %r = f32[] call(f32[] %c), to_apply=%double, is_composite=true, frontend_attributes={composite.attributes={n = 1 : i32},composite.name="my.double",composite.version="1"}
}
""",
        """%double (v: f32[]) -> f32[] {
  %v = f32[] parameter(0)
  ROOT %d = f32[] add(f32[] %v, f32[] %v)
}
""",
    ),
    "result_accuracy": long(
        "result_accuracy",
        "(f32[4]{0})->f32[4]{0}",
        """ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %e = f32[4]{0} exponential(f32[4]{0} %x), result_accuracy={tolerance={atol=0,rtol=0,ulps=1}}
  ROOT %t = f32[4]{0} tanh(f32[4]{0} %e), result_accuracy={mode=highest}
}
""",
    ),
}

SHORT = {
    "io_alias": """HloModule io_alias, input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, must-alias) }

ENTRY main {
  a = f32[2] parameter(0)
  b = f32[2] parameter(1)
  n = f32[2] negate(a)
  m = f32[2] negate(b)
  ROOT t = (f32[2], f32[2]) tuple(n, m)
}
""",
    "buffer_donor": """HloModule buffer_donor, buffer_donor={ (0, {}) }

ENTRY main {
  a = f32[2] parameter(0)
  ROOT n = f32[2] negate(a)
}
""",
    "dynamic_shapes": """HloModule dynamic_shapes

ENTRY main {
  a = f32[<=4,3] parameter(0)
  s = s32[] get-dimension-size(a), dimensions={0}
  ROOT r = f32[<=4,3] set-dimension-size(a, s), dimensions={0}
}
""",
    "dot_batched": """HloModule dot_batched

ENTRY main {
  a = bf16[2,3,4] parameter(0)
  b = bf16[2,4,5] parameter(1)
  ROOT d = f32[2,3,5] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}, operand_precision={highest,highest}
}
""",
    "reduce_variadic": f"""HloModule reduce_variadic

{ADD_SHORT}
ENTRY main {{
  a = f32[4,3] parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[3] reduce(a, z), dimensions={{0}}, to_apply=sum
}}
""",
    "conditional_branches": """HloModule conditional_branches

b0 {
  p0 = f32[] parameter(0)
  ROOT n0 = f32[] negate(p0)
}

b1 {
  p1 = f32[] parameter(0)
  ROOT e1 = f32[] exponential(p1)
}

ENTRY main {
  i = s32[] parameter(0)
  x = f32[] parameter(1)
  ROOT c = f32[] conditional(i, x, x), branch_computations={b0, b1}
}
""",
    "iota_and_rng": """HloModule iota_and_rng

ENTRY main {
  i = s32[4,2] iota(), iota_dimension=1
  lo = f32[] constant(0)
  hi = f32[] constant(1)
  r = f32[3] rng(lo, hi), distribution=rng_uniform
  ROOT t = (s32[4,2], f32[3]) tuple(i, r)
}
""",
    "bitcast_convert_precision": """HloModule bitcast_convert_precision

ENTRY main {
  a = f32[4] parameter(0)
  b = s32[4] bitcast-convert(a)
  c = f32[4] reduce-precision(a), exponent_bits=5, mantissa_bits=10
  ROOT t = (s32[4], f32[4]) tuple(b, c)
}
""",
    "topk_and_map": f"""HloModule topk_and_map

{ADD_SHORT}
ENTRY main {{
  a = f32[2,8] parameter(0)
  k = (f32[2,3], s32[2,3]) topk(a), k=3, largest=true
  ROOT m = f32[2,8] map(a, a), dimensions={{0,1}}, to_apply=sum
}}
""",
    "infeed_outfeed": """HloModule infeed_outfeed

ENTRY main {
  t = token[] after-all()
  in = (f32[2], token[]) infeed(t), infeed_config="cfg"
  v = f32[2] get-tuple-element(in), index=0
  t2 = token[] get-tuple-element(in), index=1
  ROOT o = token[] outfeed(v, t2), outfeed_shape=f32[2]{0}, outfeed_config="out"
}
""",
    "batch_norm": """HloModule batch_norm

ENTRY main {
  x = f32[2,4] parameter(0)
  s = f32[4] parameter(1)
  o = f32[4] parameter(2)
  ROOT t = (f32[2,4], f32[4], f32[4]) batch-norm-training(x, s, o), epsilon=0.001, feature_index=1
}
""",
    "execution_thread": """HloModule execution_thread

side, execution_thread="side" {
  a = f32[2] parameter(0)
  ROOT n = f32[2] negate(a)
}

ENTRY main {
  p = f32[2] parameter(0)
  s = ((f32[2]), f32[2], s32[]) call-start(p), async_execution_thread="side", to_apply=side
  ROOT d = f32[2] call-done(s)
}
""",
    "scan_op": """HloModule scan_op

step {
  c = f32[] parameter(0)
  x = f32[] parameter(1)
  s = f32[] add(c, x)
  ROOT t = (f32[], f32[]) tuple(s, s)
}

ENTRY main {
  xs = f32[4] parameter(0)
  i = f32[] constant(0)
  ROOT r = (f32[4], f32[]) scan(xs, i), dimensions={0}, to_apply=step
}
""",
    "metadata_fields": """HloModule metadata_fields

ENTRY main {
  ROOT c = f32[] constant(1), metadata={op_type="add" op_name="jit(f)/add" source_file="f.py" source_line=3 profile_type={1,2} deduplicated_name="d" stack_frame_id=4}
}
""",
    "frontend_and_statistics": """HloModule frontend_and_statistics, frontend_attributes={x.y="1",z="two"}

ENTRY main {
  ROOT c = s32[] constant(-42), statistics={visualizing_index=1,stat-1=33}, frontend_attributes={_xla_stream_annotation="1"}
}
""",
    "domain_and_barrier": """HloModule domain_and_barrier

ENTRY main {
  a = f32[] parameter(0)
  d = f32[] domain(a), domain={kind="sharding", entry={maximal device=0}, exit={maximal device=1}}
  t = (f32[]) tuple(d)
  ROOT b = (f32[]) opt-barrier(t)
}
""",
    "ragged_dot": """HloModule ragged_dot

ENTRY main {
  a = f32[11,5] parameter(0)
  b = f32[3,5,7] parameter(1)
  g = s64[3] parameter(2)
  ROOT d = f32[11,7] ragged-dot(a, b, g), lhs_contracting_dims={1}, rhs_contracting_dims={1}, lhs_ragged_dims={0}, rhs_group_dims={0}
}
""",
    "scheduled_with_layouts": """HloModule scheduled_with_layouts, is_scheduled=true, entry_computation_layout={(f32[2,3]{0,1})->f32[3,2]{1,0}}

ENTRY main {
  a = f32[2,3]{0,1} parameter(0)
  ROOT t = f32[3,2]{1,0} transpose(a), dimensions={1,0}
}
""",
}


def _scalar_module(shape: str, value: str) -> str:
    return f"HloModule m\n\nENTRY main {{\n  ROOT c = {shape} constant({value})\n}}\n\n"


READS = {  # name: (text XLA reads, the canonical text xlapy prints for it)
    "header_with_colon": (
        "HloModule old:\n\nENTRY main {\n  ROOT c = f32[] constant(1)\n}\n",
        "HloModule old\n\nENTRY main {\n  ROOT c = f32[] constant(1)\n}\n\n",
    ),
    "no_header": (
        "ENTRY main {\n  ROOT c = f32[] constant(1)\n}\n",
        "HloModule _\n\nENTRY main {\n  ROOT c = f32[] constant(1)\n}\n\n",
    ),
    "single_instruction": (
        "r = f32[2] add(f32[2] x, f32[2] y)",
        "HloModule _\n\nENTRY _ {\n  x = f32[2] parameter(0)\n  y = f32[2] parameter(1)\n"
        "  ROOT r = f32[2] add(x, y)\n}\n\n",
    ),
    "nested_operands": (
        "HloModule m\n\nENTRY main {\n"
        "  ROOT c = f32[10] add(f32[10] parameter(0), f32[10] parameter(1))\n}\n",
        "HloModule m\n\nENTRY main {\n  parameter = f32[10] parameter(0)\n"
        "  parameter.1 = f32[10] parameter(1)\n  ROOT c = f32[10] add(parameter, parameter.1)\n"
        "}\n\n",
    ),
    "compact_tuple_access": (
        "HloModule m\n\nENTRY main {\n  p0 = (f32[2], s32[]) parameter(0)\n"
        "  ROOT n = f32[2] negate(p0#0)\n}\n",
        "HloModule m\n\nENTRY main {\n  p0 = (f32[2], s32[]) parameter(0)\n"
        "  get-tuple-element = f32[2] get-tuple-element(p0), index=0\n"
        "  ROOT n = f32[2] negate(get-tuple-element)\n}\n\n",
    ),
    "inline_to_apply": (
        "HloModule m\n\nENTRY main {\n  p = f32[4] parameter(0)\n  z = f32[] constant(0)\n"
        "  ROOT r = f32[] reduce(p, z), dimensions={0}, to_apply={\n"
        "    a = f32[] parameter(0)\n    b = f32[] parameter(1)\n"
        "    ROOT s = f32[] add(a, b)\n  }\n}\n",
        "HloModule m\n\n_ {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
        "  ROOT s = f32[] add(a, b)\n}\n\nENTRY main {\n  p = f32[4] parameter(0)\n"
        "  z = f32[] constant(0)\n  ROOT r = f32[] reduce(p, z), dimensions={0}, to_apply=_\n"
        "}\n\n",
    ),
    "u64_minus_one": (
        _scalar_module("u64[]", "-1"),
        _scalar_module("u64[]", "18446744073709551615"),
    ),
    "header_string_spanning_lines": (
        'HloModule m, frontend_attributes={a="one\ntwo"}\n\nENTRY main {\n'
        "  ROOT c = f32[] constant(1)\n}\n",
        'HloModule m, frontend_attributes={a="one\\ntwo"}\n\nENTRY main {\n'
        "  ROOT c = f32[] constant(1)\n}\n\n",
    ),
    "metadata_with_commas": (
        'HloModule m\n\nENTRY main {\n  ROOT c = f32[] constant(1), metadata={op_type="a", '
        'op_name="b", source_line=3}\n}\n',
        'HloModule m\n\nENTRY main {\n  ROOT c = f32[] constant(1), metadata={op_type="a" '
        'op_name="b" source_line=3}\n}\n\n',
    ),
    "bf16_digits": (_scalar_module("bf16[]", "5e+02"), _scalar_module("bf16[]", "500")),
    "pred_words_in_arrays": (
        _scalar_module("pred[3]", "{true, false, true}"),
        _scalar_module("pred[3]", "{1, 0, 1}"),
    ),
    "slice_strides_filled_in": (
        "HloModule m\n\nENTRY main {\n  p = f32[4,6] parameter(0)\n"
        "  ROOT s = f32[2,6] slice(p), slice={[0:4:2], [0:6]}\n}\n",
        "HloModule m\n\nENTRY main {\n  p = f32[4,6] parameter(0)\n"
        "  ROOT s = f32[2,6] slice(p), slice={[0:4:2], [0:6:1]}\n}\n\n",
    ),
    "add_start_shorthand": (
        "HloModule m\n\nENTRY main {\n  p = f32[4] parameter(0)\n"
        "  s = ((f32[4], f32[4]), f32[4], s32[]) add-start(p, p)\n"
        "  ROOT d = f32[4] add-done(s)\n}\n",
        "HloModule m\n\nENTRY main {\n  p = f32[4] parameter(0)\n"
        "  s = ((f32[4], f32[4]), f32[4], s32[]) add-start(p, p)\n"
        "  ROOT d = f32[4] add-done(s)\n}\n\n",
    ),
    "long_async_of_one_op_prints_short": (
        "HloModule m\n\nw {\n  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a)\n}\n\n"
        "ENTRY main {\n  p = f32[4] parameter(0)\n"
        "  s = ((f32[4]), f32[4], s32[]) async-start(p), calls=w\n"
        "  ROOT d = f32[4] async-done(s)\n}\n",
        "HloModule m\n\nENTRY main {\n  p = f32[4] parameter(0)\n"
        "  s = ((f32[4]), f32[4], s32[]) negate-start(p)\n"
        "  ROOT d = f32[4] negate-done(s)\n}\n\n",
    ),
    "shapeless_instruction_of_nested_operands": (
        "HloModule m\n\nENTRY main {\n"
        "  ROOT c = add(f32[10] parameter(0), f32[10] parameter(1))\n}\n",
        "HloModule m\n\nENTRY main {\n  parameter = f32[10] parameter(0)\n"
        "  parameter.1 = f32[10] parameter(1)\n  ROOT c = f32[10] add(parameter, parameter.1)\n"
        "}\n\n",
    ),
    "shapes_inferred_along_a_chain": (
        "HloModule m\n\nENTRY main {\n  p = f32[2,3] parameter(0)\n"
        "  t = transpose(p), dimensions={1,0}\n  ROOT n = negate(t)\n}\n",
        "HloModule m\n\nENTRY main {\n  p = f32[2,3] parameter(0)\n"
        "  t = f32[3,2] transpose(p), dimensions={1,0}\n  ROOT n = f32[3,2] negate(t)\n}\n\n",
    ),
    "after_all_of_tokens": (
        "HloModule m\n\nENTRY main {\n  t = token[] after-all()\n"
        "  ROOT a = token[] after-all(t, t)\n}\n",
        "HloModule m\n\nENTRY main {\n  t = token[] after-all()\n"
        "  ROOT a = token[] after-all(t, t)\n}\n\n",
    ),
}


def _bad(body: str, comps: str = "", header: str = "") -> str:
    return f"HloModule m{header}\n\n{comps}ENTRY main {{\n{body}\n}}\n"


P2 = "  p = f32[2] parameter(0)\n"

REFUSES = {  # name: (text, a fragment of the error message)
    "f64_overflow": (_bad("  ROOT c = f64[] constant(1.8e308)"), "out of range for f64"),
    "f16_overflow": (_bad("  ROOT c = f16[] constant(65520)"), "out of range for f16"),
    "s8_overflow": (_bad("  ROOT c = s8[] constant(128)"), "out of range for s8"),
    "u32_negative": (_bad("  ROOT c = u32[] constant(-1)"), "out of range for u32"),
    "u64_too_big": (_bad("  ROOT c = u64[] constant(18446744073709551616)"), "out of range"),
    "huge_integer": (_bad("  ROOT c = s64[] constant(" + "9" * 5000 + ")"), "out of range"),
    "pred_two": (_bad("  ROOT c = pred[] constant(2)"), "expected 'true' or 'false'"),
    "constant_too_short": (_bad("  ROOT c = f32[3] constant({1, 2})"), "2 elements"),
    "api_version": (
        _bad('  ROOT c = f32[] custom-call(), custom_call_target="f", api_version=API_V9'),
        "'API_V9' is not a api_version",
    ),
    "comparison_direction": (
        _bad(P2 + "  ROOT c = pred[2] compare(p, p), direction=GTE"),
        "'GTE' is not a direction",
    ),
    "comparison_type": (
        _bad(P2 + "  ROOT c = pred[2] compare(p, p), direction=GT, type=REAL"),
        "'REAL' is not a type",
    ),
    "fft_type": (
        "HloModule m\nENTRY main {\n  p = c64[4] parameter(0)\n"
        "  ROOT f = c64[4] fft(p), fft_type=DFT, fft_length={4}\n}\n",
        "'DFT' is not a fft_type",
    ),
    "fusion_kind": (
        _bad(
            P2 + "  ROOT f = f32[2] fusion(p), kind=kFast, calls=x",
            "x {\n  a = f32[2] parameter(0)\n  ROOT n = f32[2] negate(a)\n}\n\n",
        ),
        "'kFast' is not a kind",
    ),
    "rng_algorithm": (
        _bad(
            "  s = u64[2] parameter(0)\n  ROOT r = (u64[2], u32[2]) rng-bit-generator(s), "
            "algorithm=rng_fastest"
        ),
        "'rng_fastest' is not a algorithm",
    ),
    "precision": (
        _bad(
            P2 + "  ROOT d = f32[] dot(p, p), lhs_contracting_dims={0}, "
            "rhs_contracting_dims={0}, operand_precision={fast,default}"
        ),
        "'fast' is not a precision",
    ),
    "result_accuracy": (
        _bad(P2 + "  ROOT e = f32[2] exponential(p), result_accuracy={mode=lowest}"),
        "expected {mode=default|highest}",
    ),
    "attribute_not_taken": (
        _bad(P2 + "  ROOT n = f32[2] negate(p), dimensions={0}"),
        "'negate' does not take attribute 'dimensions'",
    ),
    "to_apply_on_add": (
        _bad(P2 + "  ROOT n = f32[2] add(p, p), to_apply=x"),
        "'add' does not take attribute 'to_apply'",
    ),
    "window_on_dot": (
        _bad(P2 + "  ROOT d = f32[] dot(p, p), window={size=1}"),
        "'dot' does not take attribute 'window'",
    ),
    "sugar_attribute_of_wrong_op": (
        _bad(
            P2 + "  s = ((f32[2]), f32[2], s32[]) negate-start(p), dimensions={0}\n"
            "  ROOT d = f32[2] negate-done(s)"
        ),
        "'negate-start' does not take attribute 'dimensions'",
    ),
    "done_of_other_start": (
        _bad(
            P2 + "  s = ((f32[2]), f32[2], s32[]) negate-start(p)\n"
            "  ROOT d = f32[2] exponential-done(s)"
        ),
        "'d' is exponential-done but 's' starts negate op",
    ),
    "shared_async_computation": (
        _bad(
            P2 + "  s1 = ((f32[2]), f32[2], s32[]) async-start(p), calls=w\n"
            "  d1 = f32[2] async-done(s1)\n"
            "  s2 = ((f32[2]), f32[2], s32[]) async-start(p), calls=w\n"
            "  ROOT d2 = f32[2] async-done(s2)",
            "w {\n  a = f32[2] parameter(0)\n  ROOT n = f32[2] negate(a)\n}\n\n",
        ),
        "async computation w is already called",
    ),
    "operand_shape_disagrees": (
        _bad(P2 + "  ROOT n = f32[2] negate(f32[9,9] p)"),
        "operand 'p' is written as f32[9,9] but is f32[2]",
    ),
    "signature_parameter_disagrees": (
        "HloModule m\n\nENTRY %main (p: f32[3]) -> f32[2] {\n  %p = f32[2] parameter(0)\n"
        "  ROOT %n = f32[2] negate(%p)\n}\n",
        "parameter 0 is f32[3], p is f32[2]",
    ),
    "signature_result_disagrees": (
        "HloModule m\n\nENTRY %main (p: f32[2]) -> s32[2] {\n  %p = f32[2] parameter(0)\n"
        "  ROOT %n = f32[2] negate(%p)\n}\n",
        "result is s32[2], the root n is f32[2]",
    ),
    "entry_layout_disagrees": (
        _bad(
            P2 + "  ROOT n = f32[2] negate(p)",
            header=", entry_computation_layout={(f32[3])->f32[2]}",
        ),
        "parameter 0 is f32[3]",
    ),
    "declared_shape_disagrees": (
        _bad(P2 + "  ROOT n = f32[3] negate(p)"),
        "does not match the shape negate produces",
    ),
    "tile_of_zero": (_bad("  ROOT p = f32[4]{0:T(0,0)} parameter(0)"), "tile size 0"),
    "negative_memory_space": (_bad("  ROOT p = f32[4]{0:S(-1)} parameter(0)"), "-1 must not"),
    "layout_not_a_permutation": (_bad("  ROOT p = f32[4,2]{0,0} parameter(0)"), "permutation"),
    "sharding_device_count": (
        _bad(P2 + "  ROOT n = f32[2] negate(p), sharding={devices=[9,9]0,1}"),
        "2 device ids for a tile assignment of 81 tiles",
    ),
    "sharding_iota_count": (
        _bad(P2 + "  ROOT n = f32[2] negate(p), sharding={devices=[2,2]<=[8]}"),
        "the tile assignment [2,2] needs 4",
    ),
    "sharding_device_twice": (
        _bad(P2 + "  ROOT n = f32[2] negate(p), sharding={devices=[2]1,1}"),
        "must be 0..n-1, each once",
    ),
    "all_to_all_dimension": (
        _bad(P2 + "  ROOT a = f32[2] all-to-all(p), replica_groups={{0}}, dimensions={3}"),
        "out of range",
    ),
    "replica_groups_empty_group": (
        _bad(P2 + "  ROOT a = f32[2] all-gather(p), replica_groups={{}}, dimensions={0}"),
        "replica groups must not be empty",
    ),
    "replica_groups_iota_rank": (
        _bad(P2 + "  ROOT a = f32[2] all-gather(p), replica_groups=[2]<=[2], dimensions={0}"),
        "need [groups,size]",
    ),
    "mesh_unknown_axis": (
        _bad(
            P2 + "  ROOT a = f32[4] all-gather(p), replica_groups=mesh['x'=2] {'y'}, dimensions={0}"
        ),
        "mesh has no axis 'y'",
    ),
    "unknown_opcode": (_bad(P2 + "  ROOT n = f32[2] frobnicate(p)"), "unknown opcode"),
    "unknown_async_base": (_bad(P2 + "  ROOT n = f32[2] frobnicate-start(p)"), "unknown opcode"),
    "start_of_async_op": (
        _bad(P2 + "  ROOT n = f32[2] async-start-start(p)"),
        "unknown opcode",
    ),
    "undefined_operand": (_bad("  ROOT n = f32[2] negate(q)"), "undefined operand 'q'"),
    "single_instruction_untyped_operand": ("r = f32[2] negate(x)", "operand 'x' is not defined"),
    "two_roots": (
        _bad(P2 + "  ROOT a = f32[2] negate(p)\n  ROOT b = f32[2] negate(p)"),
        "more than one ROOT",
    ),
    "duplicate_attribute": (
        _bad(P2 + "  ROOT a = f32[2] reverse(p), dimensions={0}, dimensions={0}"),
        "given twice",
    ),
    "tuple_access_out_of_range": (
        _bad("  p0 = (f32[2]) parameter(0)\n  ROOT n = f32[2] negate(p0#3)"),
        "no tuple element 3",
    ),
    "dim_labels_unlabeled": (
        _bad(
            "  x = f32[1,2,3,1] parameter(0)\n  k = f32[1,3,1] parameter(1)\n"
            "  ROOT y = f32[1,2,1] convolution(x, k), window={size=1}, dim_labels=b0f?_0io->b0f"
        ),
        "unlabeled",
    ),
    "unterminated_string": (
        'HloModule m\n\nENTRY main {\n  ROOT c = f32[] constant(1), backend_config="abc\n}\n',
        "unterminated string",
    ),
    "empty_input": ("", "empty input"),
    "shape_not_inferable": (_bad(P2 + "  ROOT r = reshape(p)"), "cannot infer the shape of 'r'"),
    "inferred_operands_disagree": (
        _bad(P2 + "  q = s32[2] parameter(1)\n  ROOT r = add(p, q)"),
        "cannot infer the shape of 'r': add: operand 1 has element type s32",
    ),
    "shapeless_call": (
        _bad(
            P2 + "  ROOT r = call(p), to_apply=w",
            "w {\n  a = f32[2] parameter(0)\n  ROOT n = f32[2] negate(a)\n}\n\n",
        ),
        "write the shape of 'r': it calls a computation",
    ),
}


def _round_trip(text: str, options: PrintOptions) -> str:
    module = parse_module(text)
    verify(module)
    return print_module(module, options)


@pytest.mark.parametrize("name", sorted(LONG))
def test_long_form_prints_back_byte_identical(name):
    text = LONG[name]
    assert _round_trip(text, LONG_OPTIONS).strip() == text.strip()


@pytest.mark.parametrize("name", sorted(SHORT))
def test_short_form_prints_back_byte_identical(name):
    text = SHORT[name]
    assert _round_trip(text, PrintOptions.short()).strip() == text.strip()


@pytest.mark.parametrize("name", sorted(READS))
def test_accepted_forms_print_canonically(name):
    text, canonical = READS[name]
    assert _round_trip(text, PrintOptions.short()) == canonical
    assert _round_trip(canonical, PrintOptions.short()) == canonical


@pytest.mark.parametrize("name", sorted(REFUSES))
def test_refused_forms_raise_xlapy_errors(name):
    text, message = REFUSES[name]
    with pytest.raises(XlapyError) as info:
        verify(parse_module(text))
    assert message in str(info.value)


def test_table_sizes():
    """The tables' size, reported with the issue (and kept from shrinking by accident)."""
    assert (len(LONG), len(SHORT), len(READS), len(REFUSES)) >= (40, 18, 17, 51)
