# rng-bit-generator as a native kernel, bit for bit the interpreter's rule (rules/rng.py,
# itself checked against XLA:CPU): Threefry-2x32 (20 rounds) and Philox-4x32 (10 rounds, also
# rng_default) over counter blocks.
#
# A block b encrypts the state's counter advanced by b and yields two (three-fry) or four
# (philox) 32-bit words, which land in the bits output as the rule lays them out:
#   three-fry, 32-bit or narrower: the block's two words sit next to each other along the
#     split dimension (the first even-sized one, else the last, its odd tail dropped);
#     blocks are numbered row-major over the shape with that dimension halved;
#   three-fry, 64-bit: one block per element, (low, high) words;
#   philox, 32-bit or narrower: words row-major, four per block;
#   philox, 64-bit: two elements per block, (w0, w1) and (w2, w3) as (low, high).
# Narrower types keep the low bits of their 32-bit word. The new state (the counter advanced
# by the number of blocks, with the carry into a three-word philox state's high half) is
# written by the tile that holds block 0.
#
#   void f(i8* new_state, i8* bits, i8* state, i64 start, i64 end)
#
# [start, end) counts tiles of _TILE blocks, independent of each other, so a thunk may split
# them over the pool. The bits output must be in the default (row-major) layout.

from __future__ import annotations

import math

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import I8, I32, I64, SYMBOL, KernelSpec
from xlapy.backends.cpu.codegen.ir_release import released_text
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.shapes import Shape
from xlapy.ir.types import PrimitiveType

_TILE = 512
"""Blocks per unit of the kernel's range."""
_ALGORITHMS = {"rng_three_fry": (2,), "rng_philox": (2, 3), "rng_default": (2, 3)}
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA
_PHILOX_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_PHILOX_KEY_STEPS = (0x9E3779B9, 0xBB67AE85)


def rng_reason(instr: HloInstruction) -> str | None:
    """None when `instr` (an rng-bit-generator) can be a native kernel, else why not."""
    algorithm = instr.rng_algorithm
    if algorithm not in _ALGORITHMS:
        return f"unknown algorithm '{algorithm}'"
    (state,) = instr.operands
    st = state.shape
    if not st.is_array or st.element_type is not PrimitiveType.U64 or st.rank != 1:
        return "the state is not a u64 vector"
    if st.dims[0] not in _ALGORITHMS[algorithm]:
        return f"{algorithm} takes no u64[{st.dims[0]}] state"
    shape = instr.shape
    if not shape.is_tuple or len(shape.tuple_shapes) != 2:
        return "the result is not (state, bits)"
    new_state, bits = shape.tuple_shapes
    if not (new_state.is_array and bits.is_array) or new_state.dims != st.dims:
        return "the result is not (state, bits)"
    t = bits.element_type
    if t.bits not in (8, 16, 32, 64) or t.is_pred or t.is_complex:
        return f"no {t.text} bits"
    if bits.is_dynamic or (bits.layout is not None and bits.layout.tiles):
        return "a dynamic or tiled bits shape"
    if bits.num_elements == 0:
        return "no bits to make"
    rank = bits.rank
    if tuple(bits.layout_or_default.minor_to_major) != tuple(range(rank - 1, -1, -1)):
        return "the bits are not in the default layout"
    for s in (st, new_state):
        if s.layout is not None and s.layout.tiles:
            return "a tiled state"
    return None


class _RngEmitter:
    def __init__(self, instr: HloInstruction):
        self.instr = instr
        self.algorithm = instr.rng_algorithm
        self.three_fry = self.algorithm == "rng_three_fry"
        self.state_words = instr.operands[0].shape.dims[0]
        self.bits: Shape = instr.shape.tuple_shapes[1]
        self.wide = self.bits.element_type.bits == 64
        self.count = self.bits.num_elements
        dims = self.bits.dims or (1,)
        if self.three_fry and not self.wide:
            # XLA's pairing dimension: the first even one, else the first largest
            split = next((d for d, n in enumerate(dims) if n % 2 == 0), dims.index(max(dims)))
            self.pre = math.prod(dims[:split])
            self.split_size = dims[split]
            self.half = -(-dims[split] // 2)
            self.post = math.prod(dims[split + 1 :])
            self.blocks = self.pre * self.half * self.post
        elif self.three_fry:
            self.blocks = self.count
        else:
            words = self.count * (2 if self.wide else 1)
            self.blocks = -(-words // 4)
        self.extent = -(-self.blocks // _TILE)

    def c32(self, v: int):
        return ir.Constant(I32, v & 0xFFFFFFFF)

    def c64(self, v: int):
        return ir.Constant(I64, v)

    def emit(self) -> KernelSpec:
        self.module = ir.Module(name="rng")
        fnty = ir.FunctionType(ir.VoidType(), [I8.as_pointer()] * 3 + [I64, I64])
        fn = ir.Function(self.module, fnty, SYMBOL)
        for arg, name in zip(fn.args, ("new_state", "bits", "state", "start", "end"), strict=True):
            arg.name = name
        for arg in fn.args[:3]:
            arg.add_attribute("noalias")
        fn.attributes.add("nounwind")
        self.fn = fn
        b = self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        state_ptr = b.bitcast(fn.args[2], I64.as_pointer())
        state = [b.load(b.gep(state_ptr, [self.c64(i)], True)) for i in range(self.state_words)]
        self.key = (self._lo(state[0]), self._hi(state[0]))
        self.counter = state[1]
        self.high = state[2] if self.state_words == 3 else state[0]
        bits_ty = ir.IntType(self.bits.element_type.bits)
        self.out = b.bitcast(fn.args[1], bits_ty.as_pointer())
        self.out_ty = bits_ty
        self._new_state(fn.args[0], fn.args[3], state)
        lo = b.mul(fn.args[3], self.c64(_TILE))
        hi = b.mul(fn.args[4], self.c64(_TILE))
        hi = b.select(b.icmp_signed("<", hi, self.c64(self.blocks)), hi, self.c64(self.blocks))
        with self._loop(lo, hi, "block") as block:
            self._block(block)
        b.ret_void()
        return KernelSpec(
            SYMBOL,
            released_text(self.module),
            tuple(self.instr.shape.tuple_shapes),
            (self.instr.operands[0].shape,),
            self.extent,
        )

    def _lo(self, v):
        return self.b.trunc(v, I32)

    def _hi(self, v):
        return self.b.trunc(self.b.lshr(v, self.c64(32)), I32)

    def _new_state(self, ptr, start, state) -> None:
        """Write the advanced state when this call's range holds tile 0."""
        b = self.b
        with b.if_then(b.icmp_signed("==", start, self.c64(0))):
            out = b.bitcast(ptr, I64.as_pointer())
            low = b.add(state[1], self.c64(self.blocks))
            words = [state[0], low]
            if self.state_words == 3:
                carry = b.zext(b.icmp_unsigned("<", low, state[1]), I64)
                words.append(b.add(state[2], carry))
            for i, w in enumerate(words):
                b.store(w, b.gep(out, [self.c64(i)], True))

    def _loop(self, lo, hi, name: str):
        emitter = self

        class _Loop:
            def __enter__(self_inner):
                b = emitter.b
                pre = b.block
                self_inner.header = emitter.fn.append_basic_block(f"{name}.header")
                body = emitter.fn.append_basic_block(f"{name}.body")
                self_inner.exit = emitter.fn.append_basic_block(f"{name}.exit")
                b.branch(self_inner.header)
                b.position_at_end(self_inner.header)
                self_inner.i = b.phi(I64, name=name)
                self_inner.i.add_incoming(lo, pre)
                b.cbranch(b.icmp_signed("<", self_inner.i, hi), body, self_inner.exit)
                b.position_at_end(body)
                return self_inner.i

            def __exit__(self_inner, exc_type, exc, tb):
                if exc_type is not None:
                    return False
                b = emitter.b
                nxt = b.add(self_inner.i, emitter.c64(1), flags=["nsw"])
                self_inner.i.add_incoming(nxt, b.block)
                b.branch(self_inner.header)
                b.position_at_end(self_inner.exit)
                return False

        return _Loop()

    def _rotl(self, x, r: int):
        b = self.b
        return b.or_(b.shl(x, self.c32(r)), b.lshr(x, self.c32(32 - r)))

    def _threefry(self, x0, x1):
        b = self.b
        k0, k1 = self.key
        schedule = (k0, k1, b.xor(b.xor(self.c32(_PARITY), k0), k1))
        x0, x1 = b.add(x0, k0), b.add(x1, k1)
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                x0 = b.add(x0, x1)
                x1 = b.xor(self._rotl(x1, r), x0)
            x0 = b.add(x0, schedule[(i + 1) % 3])
            x1 = b.add(b.add(x1, schedule[(i + 2) % 3]), self.c32(i + 1))
        return x0, x1

    def _philox(self, c0, c1, c2, c3):
        b = self.b
        k0, k1 = self.key
        m0, m1 = (self.c64(m) for m in _PHILOX_MULTIPLIERS)
        for _ in range(10):
            p0 = b.mul(b.zext(c0, I64), m0)
            p1 = b.mul(b.zext(c2, I64), m1)
            lo0, hi0 = self._lo(p0), self._hi(p0)
            lo1, hi1 = self._lo(p1), self._hi(p1)
            c0, c1, c2, c3 = b.xor(b.xor(hi1, c1), k0), lo1, b.xor(b.xor(hi0, c3), k1), lo0
            k0 = b.add(k0, self.c32(_PHILOX_KEY_STEPS[0]))
            k1 = b.add(k1, self.c32(_PHILOX_KEY_STEPS[1]))
        return c0, c1, c2, c3

    def _store(self, word, at) -> None:
        """Store a 32-bit word (or a 64-bit value) at element `at`, keeping the low bits."""
        b = self.b
        width = self.out_ty.width
        value = word
        if word.type.width > width:
            value = b.trunc(word, self.out_ty)
        b.store(value, b.gep(self.out, [at], True))

    def _pair(self, w_lo, w_hi):
        b = self.b
        return b.or_(b.zext(w_lo, I64), b.shl(b.zext(w_hi, I64), self.c64(32)))

    def _block(self, block) -> None:
        b = self.b
        counter = b.add(self.counter, block)
        if self.three_fry:
            x0, x1 = self._threefry(self._lo(counter), self._hi(counter))
            if self.wide:
                self._store(self._pair(x0, x1), block)
                return
            q = self.c64(self.post)
            p = b.udiv(block, self.c64(self.half * self.post))
            h = b.urem(b.udiv(block, q), self.c64(self.half))
            r = b.urem(block, q)
            base = b.add(b.mul(p, self.c64(self.split_size * self.post)), r)
            s0 = b.mul(h, self.c64(2))
            self._store(x0, b.add(base, b.mul(s0, q)))
            s1 = b.add(s0, self.c64(1))
            with b.if_then(b.icmp_signed("<", s1, self.c64(self.split_size))):
                self._store(x1, b.add(base, b.mul(s1, q)))
            return
        carry = b.zext(b.icmp_unsigned("<", counter, self.counter), I64)
        high = b.add(self.high, carry)
        words = self._philox(self._lo(counter), self._hi(counter), self._lo(high), self._hi(high))
        if self.wide:
            values, first = (
                [self._pair(*words[:2]), self._pair(*words[2:])],
                b.mul(block, self.c64(2)),
            )
        else:
            values, first = list(words), b.mul(block, self.c64(4))
        for k, v in enumerate(values):
            at = b.add(first, self.c64(k))
            if (self.blocks - 1) * len(values) + k < self.count:  # never past the end
                self._store(v, at)
            else:
                with b.if_then(b.icmp_signed("<", at, self.c64(self.count))):
                    self._store(v, at)


def rng_description(instr: HloInstruction) -> str:
    """A text that determines the IR emit_rng makes for `instr` (a cache key)."""
    algorithm = instr.rng_algorithm
    return f"rng v1 {algorithm} {instr.operands[0].shape.to_text()} -> {instr.shape.to_text()}"


def rng_signature(instr: HloInstruction) -> tuple[tuple[Shape, ...], tuple[Shape, ...], int]:
    """(outputs, params, outer extent) of `instr`'s kernel, without emitting it."""
    emitter = _RngEmitter(instr)
    return tuple(instr.shape.tuple_shapes), (instr.operands[0].shape,), emitter.extent


def emit_rng(instr: HloInstruction) -> KernelSpec:
    """The LLVM IR of `instr`'s rng-bit-generator kernel (see the file comment); the caller
    has checked rng_reason."""
    return _RngEmitter(instr).emit()
