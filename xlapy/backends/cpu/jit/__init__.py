"""LLVM IR -> native code in this process (llvmlite), the loaded kernels as callables, and the
authenticated on-disk caches of kernel objects and compiled modules."""
