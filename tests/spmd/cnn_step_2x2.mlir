module @jit_cnn_step attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=2, "model"=2]> {stablehlo.mesh = {axes = [{name = "data", size = 2 : i64}, {name = "model", size = 2 : i64}]}}
  func.func public @main(%arg0: tensor<3x3x4x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {}, {"model"}]>}, %arg1: tensor<128x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}, %arg2: tensor<4x8x8x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"model"}, {}, {}]>}) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<3x3x4x8xf32> {jax.result_info = "result[1]"}, tensor<128x4xf32> {jax.result_info = "result[2]"}) {
    %0 = stablehlo.convolution(%arg2, %arg0) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<4x8x8x4xf32>, tensor<3x3x4x8xf32>) -> tensor<4x8x8x8xf32>
    %1 = call @relu(%0) : (tensor<4x8x8x8xf32>) -> tensor<4x8x8x8xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x8x8x8xf32>
    %3 = stablehlo.compare GT, %0, %2, FLOAT : (tensor<4x8x8x8xf32>, tensor<4x8x8x8xf32>) -> tensor<4x8x8x8xi1>
    %cst_0 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %4 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<f32>
    %5 = "stablehlo.reduce_window"(%1, %4) <{base_dilations = array<i64: 1, 1, 1, 1>, padding = dense<0> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 1>, window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: 1, 2, 2, 1>}> ({
    ^bb0(%arg3: tensor<f32>, %arg4: tensor<f32>):
      %32 = stablehlo.maximum %arg3, %arg4 : tensor<f32>
      stablehlo.return %32 : tensor<f32>
    }) : (tensor<4x8x8x8xf32>, tensor<f32>) -> tensor<4x4x4x8xf32>
    %6 = stablehlo.reshape %5 : (tensor<4x4x4x8xf32>) -> tensor<4x128xf32>
    %7 = stablehlo.dot_general %6, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x128xf32>, tensor<128x4xf32>) -> tensor<4x4xf32>
    %8 = stablehlo.multiply %7, %7 : tensor<4x4xf32>
    %cst_1 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %9 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<4x4xf32>
    %10 = stablehlo.multiply %9, %7 : tensor<4x4xf32>
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %11 = stablehlo.reduce(%8 init: %cst_2) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<f32>
    %cst_3 = stablehlo.constant dense<1.600000e+01> : tensor<f32>
    %12 = stablehlo.divide %11, %cst_3 : tensor<f32>
    %cst_4 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_5 = stablehlo.constant dense<1.600000e+01> : tensor<f32>
    %13 = stablehlo.divide %cst_4, %cst_5 : tensor<f32>
    %14 = stablehlo.broadcast_in_dim %13, dims = [] : (tensor<f32>) -> tensor<4x4xf32>
    %15 = stablehlo.multiply %14, %10 : tensor<4x4xf32>
    %16 = stablehlo.dot_general %15, %6, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x4xf32>, tensor<4x128xf32>) -> tensor<4x128xf32>
    %17 = stablehlo.transpose %16, dims = [1, 0] : (tensor<4x128xf32>) -> tensor<128x4xf32>
    %18 = stablehlo.dot_general %15, %arg1, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<4x4xf32>, tensor<128x4xf32>) -> tensor<4x128xf32>
    %19 = stablehlo.reshape %18 : (tensor<4x128xf32>) -> tensor<4x4x4x8xf32>
    %cst_6 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %20 = stablehlo.pad %1, %cst_6, low = [0, 0, 0, 0], high = [0, 0, 0, 0], interior = [0, 0, 0, 0] : (tensor<4x8x8x8xf32>, tensor<f32>) -> tensor<4x8x8x8xf32>
    %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %21 = "stablehlo.select_and_scatter"(%20, %19, %cst_7) <{padding = dense<0> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: 1, 2, 2, 1>}> ({
    ^bb0(%arg3: tensor<f32>, %arg4: tensor<f32>):
      %32 = stablehlo.compare GE, %arg3, %arg4, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      stablehlo.return %32 : tensor<i1>
    }, {
    ^bb0(%arg3: tensor<f32>, %arg4: tensor<f32>):
      %32 = stablehlo.add %arg3, %arg4 : tensor<f32>
      stablehlo.return %32 : tensor<f32>
    }) : (tensor<4x8x8x8xf32>, tensor<4x4x4x8xf32>, tensor<f32>) -> tensor<4x8x8x8xf32>
    %22 = stablehlo.slice %21 [0:4, 0:8, 0:8, 0:8] : (tensor<4x8x8x8xf32>) -> tensor<4x8x8x8xf32>
    %cst_8 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %23 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<4x8x8x8xf32>
    %24 = stablehlo.select %3, %22, %23 : tensor<4x8x8x8xi1>, tensor<4x8x8x8xf32>
    %25 = stablehlo.convolution(%arg2, %24) dim_numbers = [f, 0, 1, b]x[i, 0, 1, o]->[0, 1, b, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<4x8x8x4xf32>, tensor<4x8x8x8xf32>) -> tensor<3x3x4x8xf32>
    %cst_9 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %26 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<3x3x4x8xf32>
    %27 = stablehlo.multiply %26, %25 : tensor<3x3x4x8xf32>
    %28 = stablehlo.subtract %arg0, %27 : tensor<3x3x4x8xf32>
    %cst_10 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %29 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<128x4xf32>
    %30 = stablehlo.multiply %29, %17 : tensor<128x4xf32>
    %31 = stablehlo.subtract %arg1, %30 : tensor<128x4xf32>
    return %12, %28, %31 : tensor<f32>, tensor<3x3x4x8xf32>, tensor<128x4xf32>
  }
  func.func private @relu(%arg0: tensor<4x8x8x8xf32>) -> tensor<4x8x8x8xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x8x8x8xf32>
    %1 = stablehlo.maximum %arg0, %0 : tensor<4x8x8x8xf32>
    return %1 : tensor<4x8x8x8xf32>
  }
}
