"""What a compiled CPU program runs: the Thunk base (slices, execution context, sequences),
one module per thunk family, the concurrent executor and the worker pool."""
