"""HLO -> LLVM IR for the CPU backend: the kernel emitter, its elemental rules, inline math,
and the scatter loop emitter. Nothing here compiles or runs code (that is jit/ and runtime/)."""
