module @m attributes {mhlo.num_replicas = 2 : i32} {
  func.func public @main(%arg0: tensor<4xf32> {mhlo.sharding = "{replicated}"}) -> tensor<4xf32> {
    %0 = stablehlo.custom_call @my_target(%arg0) {api_version = 2 : i32, backend_config = "opaque bytes", has_side_effect = true, output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 0, operand_tuple_indices = []>]} : (tensor<4xf32>) -> tensor<4xf32>
    %1 = stablehlo.custom_call @ffi_target(%0) {api_version = 4 : i32, mhlo.backend_config = {n = 3 : i64, name = "x"}, called_computations = [@helper]} : (tensor<4xf32>) -> tensor<4xf32>
    %2 = stablehlo.custom_call @Sharding(%1) {mhlo.sharding = "{devices=[2]<=[2]}"} : (tensor<4xf32>) -> tensor<4xf32>
    return %2 : tensor<4xf32>
  }
  func.func private @helper(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    return %arg0 : tensor<4xf32>
  }
}
