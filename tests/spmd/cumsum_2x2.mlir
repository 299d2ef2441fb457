module @jit_cumsum attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=2, "model"=2]> {stablehlo.mesh = {axes = [{name = "data", size = 2 : i64}, {name = "model", size = 2 : i64}]}}
  func.func public @main(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"model"}]>}) -> (tensor<8x8xf32> {jax.result_info = "result"}) {
    %0 = call @cumsum(%arg0) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %1 = call @cumsum_1(%arg0) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %2 = stablehlo.add %0, %1 : tensor<8x8xf32>
    return %2 : tensor<8x8xf32>
  }
  func.func private @cumsum(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %0 = call @cumsum_0(%arg0) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    return %0 : tensor<8x8xf32>
  }
  func.func private @cumsum_0(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<f32>
    %1 = "stablehlo.reduce_window"(%arg0, %0) <{base_dilations = array<i64: 1, 1>, padding = dense<[[0, 0], [7, 0]]> : tensor<2x2xi64>, window_dilations = array<i64: 1, 1>, window_dimensions = array<i64: 1, 8>, window_strides = array<i64: 1, 1>}> ({
    ^bb0(%arg1: tensor<f32>, %arg2: tensor<f32>):
      %2 = stablehlo.add %arg1, %arg2 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>, tensor<f32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
  func.func private @cumsum_1(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %0 = call @cumsum_2(%arg0) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    return %0 : tensor<8x8xf32>
  }
  func.func private @cumsum_2(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<f32>
    %1 = "stablehlo.reduce_window"(%arg0, %0) <{base_dilations = array<i64: 1, 1>, padding = dense<[[7, 0], [0, 0]]> : tensor<2x2xi64>, window_dilations = array<i64: 1, 1>, window_dimensions = array<i64: 8, 1>, window_strides = array<i64: 1, 1>}> ({
    ^bb0(%arg1: tensor<f32>, %arg2: tensor<f32>):
      %2 = stablehlo.add %arg1, %arg2 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>, tensor<f32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}
