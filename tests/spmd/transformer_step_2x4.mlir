module @jit_block_step attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=2, "model"=4]> {stablehlo.mesh = {axes = [{name = "data", size = 2 : i64}, {name = "model", size = 4 : i64}]}}
  func.func public @main(%arg0: tensor<16x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}, %arg1: tensor<16x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}, %arg2: tensor<16x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}, %arg3: tensor<16x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {}]>}, %arg4: tensor<16x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}, %arg5: tensor<32x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {}]>}, %arg6: tensor<16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>}, %arg7: tensor<4x8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {}]>}) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<16x16xf32> {jax.result_info = "result[1]"}, tensor<16x16xf32> {jax.result_info = "result[2]"}, tensor<16x16xf32> {jax.result_info = "result[3]"}, tensor<16x16xf32> {jax.result_info = "result[4]"}, tensor<16x32xf32> {jax.result_info = "result[5]"}, tensor<32x16xf32> {jax.result_info = "result[6]"}, tensor<16xf32> {jax.result_info = "result[7]"}) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.reduce(%arg7 init: %cst) applies stablehlo.add across dimensions = [2] : (tensor<4x8x16xf32>, tensor<f32>) -> tensor<4x8xf32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [0, 1] : (tensor<4x8xf32>) -> tensor<4x8x1xf32>
    %cst_0 = stablehlo.constant dense<1.600000e+01> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<4x8x1xf32>
    %3 = stablehlo.divide %1, %2 : tensor<4x8x1xf32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [0, 1, 2] : (tensor<4x8x1xf32>) -> tensor<4x8x16xf32>
    %5 = stablehlo.subtract %arg7, %4 : tensor<4x8x16xf32>
    %6 = stablehlo.multiply %5, %5 : tensor<4x8x16xf32>
    %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %7 = stablehlo.reduce(%6 init: %cst_1) applies stablehlo.add across dimensions = [2] : (tensor<4x8x16xf32>, tensor<f32>) -> tensor<4x8xf32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [0, 1] : (tensor<4x8xf32>) -> tensor<4x8x1xf32>
    %cst_2 = stablehlo.constant dense<1.600000e+01> : tensor<f32>
    %9 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<4x8x1xf32>
    %10 = stablehlo.divide %8, %9 : tensor<4x8x1xf32>
    %11 = stablehlo.broadcast_in_dim %3, dims = [0, 1, 2] : (tensor<4x8x1xf32>) -> tensor<4x8x16xf32>
    %12 = stablehlo.subtract %arg7, %11 : tensor<4x8x16xf32>
    %cst_3 = stablehlo.constant dense<9.99999974E-6> : tensor<f32>
    %13 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<4x8x1xf32>
    %14 = stablehlo.add %10, %13 : tensor<4x8x1xf32>
    %15 = stablehlo.rsqrt %14 : tensor<4x8x1xf32>
    %16 = stablehlo.broadcast_in_dim %15, dims = [0, 1, 2] : (tensor<4x8x1xf32>) -> tensor<4x8x16xf32>
    %17 = stablehlo.multiply %12, %16 : tensor<4x8x16xf32>
    %18 = stablehlo.broadcast_in_dim %arg6, dims = [2] : (tensor<16xf32>) -> tensor<1x1x16xf32>
    %19 = stablehlo.broadcast_in_dim %18, dims = [0, 1, 2] : (tensor<1x1x16xf32>) -> tensor<4x8x16xf32>
    %20 = stablehlo.multiply %17, %19 : tensor<4x8x16xf32>
    %cst_4 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %21 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<4x8x16xf32>
    %22 = stablehlo.add %20, %21 : tensor<4x8x16xf32>
    %23 = stablehlo.dot_general %22, %arg0, contracting_dims = [2] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<16x16xf32>) -> tensor<4x8x16xf32>
    %24 = stablehlo.reshape %23 : (tensor<4x8x16xf32>) -> tensor<4x8x4x4xf32>
    %25 = stablehlo.dot_general %22, %arg1, contracting_dims = [2] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<16x16xf32>) -> tensor<4x8x16xf32>
    %26 = stablehlo.reshape %25 : (tensor<4x8x16xf32>) -> tensor<4x8x4x4xf32>
    %27 = stablehlo.dot_general %22, %arg2, contracting_dims = [2] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<16x16xf32>) -> tensor<4x8x16xf32>
    %28 = stablehlo.reshape %27 : (tensor<4x8x16xf32>) -> tensor<4x8x4x4xf32>
    %29 = stablehlo.dot_general %24, %26, batching_dims = [0, 2] x [0, 2], contracting_dims = [3] x [3], precision = [DEFAULT, DEFAULT] : (tensor<4x8x4x4xf32>, tensor<4x8x4x4xf32>) -> tensor<4x4x8x8xf32>
    %cst_5 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %30 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<4x4x8x8xf32>
    %31 = stablehlo.divide %29, %30 : tensor<4x4x8x8xf32>
    %cst_6 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %32 = stablehlo.reduce(%31 init: %cst_6) applies stablehlo.maximum across dimensions = [3] : (tensor<4x4x8x8xf32>, tensor<f32>) -> tensor<4x4x8xf32>
    %cst_7 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %33 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<4x4x8xf32>
    %34 = stablehlo.maximum %33, %32 : tensor<4x4x8xf32>
    %35 = stablehlo.broadcast_in_dim %34, dims = [0, 1, 2] : (tensor<4x4x8xf32>) -> tensor<4x4x8x1xf32>
    %36 = stablehlo.broadcast_in_dim %35, dims = [0, 1, 2, 3] : (tensor<4x4x8x1xf32>) -> tensor<4x4x8x8xf32>
    %37 = stablehlo.subtract %31, %36 : tensor<4x4x8x8xf32>
    %38 = stablehlo.exponential %37 : tensor<4x4x8x8xf32>
    %cst_8 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %39 = stablehlo.reduce(%38 init: %cst_8) applies stablehlo.add across dimensions = [3] : (tensor<4x4x8x8xf32>, tensor<f32>) -> tensor<4x4x8xf32>
    %40 = stablehlo.broadcast_in_dim %39, dims = [0, 1, 2] : (tensor<4x4x8xf32>) -> tensor<4x4x8x1xf32>
    %41 = stablehlo.broadcast_in_dim %40, dims = [0, 1, 2, 3] : (tensor<4x4x8x1xf32>) -> tensor<4x4x8x8xf32>
    %42 = stablehlo.divide %38, %41 : tensor<4x4x8x8xf32>
    %43 = stablehlo.multiply %40, %40 : tensor<4x4x8x1xf32>
    %cst_9 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %44 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<4x4x8x1xf32>
    %45 = stablehlo.divide %44, %43 : tensor<4x4x8x1xf32>
    %46 = stablehlo.dot_general %28, %42, batching_dims = [0, 2] x [0, 1], contracting_dims = [1] x [3], precision = [DEFAULT, DEFAULT] : (tensor<4x8x4x4xf32>, tensor<4x4x8x8xf32>) -> tensor<4x4x4x8xf32>
    %47 = stablehlo.transpose %46, dims = [0, 3, 1, 2] : (tensor<4x4x4x8xf32>) -> tensor<4x8x4x4xf32>
    %48 = stablehlo.reshape %47 : (tensor<4x8x4x4xf32>) -> tensor<4x8x16xf32>
    %49 = stablehlo.dot_general %48, %arg3, contracting_dims = [2] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<16x16xf32>) -> tensor<4x8x16xf32>
    %50 = stablehlo.add %arg7, %49 : tensor<4x8x16xf32>
    %cst_10 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %51 = stablehlo.reduce(%50 init: %cst_10) applies stablehlo.add across dimensions = [2] : (tensor<4x8x16xf32>, tensor<f32>) -> tensor<4x8xf32>
    %52 = stablehlo.broadcast_in_dim %51, dims = [0, 1] : (tensor<4x8xf32>) -> tensor<4x8x1xf32>
    %cst_11 = stablehlo.constant dense<1.600000e+01> : tensor<f32>
    %53 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<4x8x1xf32>
    %54 = stablehlo.divide %52, %53 : tensor<4x8x1xf32>
    %55 = stablehlo.broadcast_in_dim %54, dims = [0, 1, 2] : (tensor<4x8x1xf32>) -> tensor<4x8x16xf32>
    %56 = stablehlo.subtract %50, %55 : tensor<4x8x16xf32>
    %57 = stablehlo.multiply %56, %56 : tensor<4x8x16xf32>
    %cst_12 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %58 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<4x8x16xf32>
    %59 = stablehlo.multiply %58, %56 : tensor<4x8x16xf32>
    %cst_13 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %60 = stablehlo.reduce(%57 init: %cst_13) applies stablehlo.add across dimensions = [2] : (tensor<4x8x16xf32>, tensor<f32>) -> tensor<4x8xf32>
    %61 = stablehlo.broadcast_in_dim %60, dims = [0, 1] : (tensor<4x8xf32>) -> tensor<4x8x1xf32>
    %cst_14 = stablehlo.constant dense<1.600000e+01> : tensor<f32>
    %62 = stablehlo.broadcast_in_dim %cst_14, dims = [] : (tensor<f32>) -> tensor<4x8x1xf32>
    %63 = stablehlo.divide %61, %62 : tensor<4x8x1xf32>
    %64 = stablehlo.broadcast_in_dim %54, dims = [0, 1, 2] : (tensor<4x8x1xf32>) -> tensor<4x8x16xf32>
    %65 = stablehlo.subtract %50, %64 : tensor<4x8x16xf32>
    %cst_15 = stablehlo.constant dense<9.99999974E-6> : tensor<f32>
    %66 = stablehlo.broadcast_in_dim %cst_15, dims = [] : (tensor<f32>) -> tensor<4x8x1xf32>
    %67 = stablehlo.add %63, %66 : tensor<4x8x1xf32>
    %68 = stablehlo.rsqrt %67 : tensor<4x8x1xf32>
    %69 = stablehlo.divide %68, %67 : tensor<4x8x1xf32>
    %cst_16 = stablehlo.constant dense<-5.000000e-01> : tensor<f32>
    %70 = stablehlo.broadcast_in_dim %cst_16, dims = [] : (tensor<f32>) -> tensor<4x8x1xf32>
    %71 = stablehlo.multiply %70, %69 : tensor<4x8x1xf32>
    %72 = stablehlo.broadcast_in_dim %68, dims = [0, 1, 2] : (tensor<4x8x1xf32>) -> tensor<4x8x16xf32>
    %73 = stablehlo.multiply %65, %72 : tensor<4x8x16xf32>
    %74 = stablehlo.broadcast_in_dim %arg6, dims = [2] : (tensor<16xf32>) -> tensor<1x1x16xf32>
    %75 = stablehlo.broadcast_in_dim %74, dims = [0, 1, 2] : (tensor<1x1x16xf32>) -> tensor<4x8x16xf32>
    %76 = stablehlo.multiply %73, %75 : tensor<4x8x16xf32>
    %cst_17 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %77 = stablehlo.broadcast_in_dim %cst_17, dims = [] : (tensor<f32>) -> tensor<4x8x16xf32>
    %78 = stablehlo.add %76, %77 : tensor<4x8x16xf32>
    %79 = stablehlo.dot_general %78, %arg4, contracting_dims = [2] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<16x32xf32>) -> tensor<4x8x32xf32>
    %80 = stablehlo.multiply %79, %79 : tensor<4x8x32xf32>
    %81 = stablehlo.multiply %80, %79 : tensor<4x8x32xf32>
    %82 = stablehlo.multiply %79, %79 : tensor<4x8x32xf32>
    %cst_18 = stablehlo.constant dense<3.000000e+00> : tensor<f32>
    %83 = stablehlo.broadcast_in_dim %cst_18, dims = [] : (tensor<f32>) -> tensor<4x8x32xf32>
    %84 = stablehlo.multiply %83, %82 : tensor<4x8x32xf32>
    %cst_19 = stablehlo.constant dense<4.471500e-02> : tensor<f32>
    %85 = stablehlo.broadcast_in_dim %cst_19, dims = [] : (tensor<f32>) -> tensor<4x8x32xf32>
    %86 = stablehlo.multiply %85, %81 : tensor<4x8x32xf32>
    %87 = stablehlo.add %79, %86 : tensor<4x8x32xf32>
    %cst_20 = stablehlo.constant dense<0.797884583> : tensor<f32>
    %88 = stablehlo.broadcast_in_dim %cst_20, dims = [] : (tensor<f32>) -> tensor<4x8x32xf32>
    %89 = stablehlo.multiply %88, %87 : tensor<4x8x32xf32>
    %90 = stablehlo.tanh %89 : tensor<4x8x32xf32>
    %cst_21 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %91 = stablehlo.broadcast_in_dim %cst_21, dims = [] : (tensor<f32>) -> tensor<4x8x32xf32>
    %92 = stablehlo.subtract %91, %90 : tensor<4x8x32xf32>
    %cst_22 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %93 = stablehlo.broadcast_in_dim %cst_22, dims = [] : (tensor<f32>) -> tensor<4x8x32xf32>
    %94 = stablehlo.add %93, %90 : tensor<4x8x32xf32>
    %cst_23 = stablehlo.constant dense<5.000000e-01> : tensor<f32>
    %95 = stablehlo.broadcast_in_dim %cst_23, dims = [] : (tensor<f32>) -> tensor<4x8x32xf32>
    %96 = stablehlo.multiply %95, %94 : tensor<4x8x32xf32>
    %97 = stablehlo.multiply %79, %96 : tensor<4x8x32xf32>
    %98 = stablehlo.dot_general %97, %arg5, contracting_dims = [2] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8x32xf32>, tensor<32x16xf32>) -> tensor<4x8x16xf32>
    %99 = stablehlo.add %50, %98 : tensor<4x8x16xf32>
    %100 = stablehlo.multiply %99, %99 : tensor<4x8x16xf32>
    %cst_24 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %101 = stablehlo.broadcast_in_dim %cst_24, dims = [] : (tensor<f32>) -> tensor<4x8x16xf32>
    %102 = stablehlo.multiply %101, %99 : tensor<4x8x16xf32>
    %cst_25 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %103 = stablehlo.reduce(%100 init: %cst_25) applies stablehlo.add across dimensions = [0, 1, 2] : (tensor<4x8x16xf32>, tensor<f32>) -> tensor<f32>
    %cst_26 = stablehlo.constant dense<5.120000e+02> : tensor<f32>
    %104 = stablehlo.divide %103, %cst_26 : tensor<f32>
    %cst_27 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_28 = stablehlo.constant dense<5.120000e+02> : tensor<f32>
    %105 = stablehlo.divide %cst_27, %cst_28 : tensor<f32>
    %106 = stablehlo.broadcast_in_dim %105, dims = [] : (tensor<f32>) -> tensor<4x8x16xf32>
    %107 = stablehlo.multiply %106, %102 : tensor<4x8x16xf32>
    %108 = stablehlo.dot_general %107, %97, contracting_dims = [0, 1] x [0, 1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<4x8x32xf32>) -> tensor<16x32xf32>
    %109 = stablehlo.transpose %108, dims = [1, 0] : (tensor<16x32xf32>) -> tensor<32x16xf32>
    %110 = stablehlo.dot_general %107, %arg5, contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<32x16xf32>) -> tensor<4x8x32xf32>
    %111 = stablehlo.multiply %79, %110 : tensor<4x8x32xf32>
    %112 = stablehlo.multiply %110, %96 : tensor<4x8x32xf32>
    %cst_29 = stablehlo.constant dense<5.000000e-01> : tensor<f32>
    %113 = stablehlo.broadcast_in_dim %cst_29, dims = [] : (tensor<f32>) -> tensor<4x8x32xf32>
    %114 = stablehlo.multiply %113, %111 : tensor<4x8x32xf32>
    %115 = stablehlo.multiply %114, %92 : tensor<4x8x32xf32>
    %116 = stablehlo.multiply %115, %90 : tensor<4x8x32xf32>
    %117 = stablehlo.add %115, %116 : tensor<4x8x32xf32>
    %cst_30 = stablehlo.constant dense<0.797884583> : tensor<f32>
    %118 = stablehlo.broadcast_in_dim %cst_30, dims = [] : (tensor<f32>) -> tensor<4x8x32xf32>
    %119 = stablehlo.multiply %118, %117 : tensor<4x8x32xf32>
    %120 = stablehlo.add %112, %119 : tensor<4x8x32xf32>
    %cst_31 = stablehlo.constant dense<4.471500e-02> : tensor<f32>
    %121 = stablehlo.broadcast_in_dim %cst_31, dims = [] : (tensor<f32>) -> tensor<4x8x32xf32>
    %122 = stablehlo.multiply %121, %119 : tensor<4x8x32xf32>
    %123 = stablehlo.multiply %122, %84 : tensor<4x8x32xf32>
    %124 = stablehlo.add %120, %123 : tensor<4x8x32xf32>
    %125 = stablehlo.dot_general %124, %78, contracting_dims = [0, 1] x [0, 1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x32xf32>, tensor<4x8x16xf32>) -> tensor<32x16xf32>
    %126 = stablehlo.transpose %125, dims = [1, 0] : (tensor<32x16xf32>) -> tensor<16x32xf32>
    %127 = stablehlo.dot_general %124, %arg4, contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x32xf32>, tensor<16x32xf32>) -> tensor<4x8x16xf32>
    %128 = stablehlo.multiply %73, %127 : tensor<4x8x16xf32>
    %cst_32 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %129 = stablehlo.reduce(%128 init: %cst_32) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x8x16xf32>, tensor<f32>) -> tensor<16xf32>
    %130 = stablehlo.reshape %129 : (tensor<16xf32>) -> tensor<1x1x16xf32>
    %131 = stablehlo.broadcast_in_dim %74, dims = [0, 1, 2] : (tensor<1x1x16xf32>) -> tensor<4x8x16xf32>
    %132 = stablehlo.multiply %127, %131 : tensor<4x8x16xf32>
    %cst_33 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %133 = stablehlo.reduce(%130 init: %cst_33) applies stablehlo.add across dimensions = [0, 1] : (tensor<1x1x16xf32>, tensor<f32>) -> tensor<16xf32>
    %134 = stablehlo.multiply %65, %132 : tensor<4x8x16xf32>
    %cst_34 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %135 = stablehlo.reduce(%134 init: %cst_34) applies stablehlo.add across dimensions = [2] : (tensor<4x8x16xf32>, tensor<f32>) -> tensor<4x8xf32>
    %136 = stablehlo.reshape %135 : (tensor<4x8xf32>) -> tensor<4x8x1xf32>
    %137 = stablehlo.broadcast_in_dim %68, dims = [0, 1, 2] : (tensor<4x8x1xf32>) -> tensor<4x8x16xf32>
    %138 = stablehlo.multiply %132, %137 : tensor<4x8x16xf32>
    %139 = stablehlo.multiply %136, %71 : tensor<4x8x1xf32>
    %140 = stablehlo.negate %138 : tensor<4x8x16xf32>
    %cst_35 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %141 = stablehlo.reduce(%140 init: %cst_35) applies stablehlo.add across dimensions = [2] : (tensor<4x8x16xf32>, tensor<f32>) -> tensor<4x8xf32>
    %142 = stablehlo.reshape %141 : (tensor<4x8xf32>) -> tensor<4x8x1xf32>
    %143 = stablehlo.add %107, %138 : tensor<4x8x16xf32>
    %cst_36 = stablehlo.constant dense<1.600000e+01> : tensor<f32>
    %144 = stablehlo.broadcast_in_dim %cst_36, dims = [] : (tensor<f32>) -> tensor<4x8x1xf32>
    %145 = stablehlo.divide %139, %144 : tensor<4x8x1xf32>
    %cst_37 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %146 = stablehlo.reduce(%145 init: %cst_37) applies stablehlo.add across dimensions = [2] : (tensor<4x8x1xf32>, tensor<f32>) -> tensor<4x8xf32>
    %147 = stablehlo.broadcast_in_dim %146, dims = [0, 1] : (tensor<4x8xf32>) -> tensor<4x8x16xf32>
    %148 = stablehlo.multiply %147, %59 : tensor<4x8x16xf32>
    %149 = stablehlo.negate %148 : tensor<4x8x16xf32>
    %cst_38 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %150 = stablehlo.reduce(%149 init: %cst_38) applies stablehlo.add across dimensions = [2] : (tensor<4x8x16xf32>, tensor<f32>) -> tensor<4x8xf32>
    %151 = stablehlo.reshape %150 : (tensor<4x8xf32>) -> tensor<4x8x1xf32>
    %152 = stablehlo.add %143, %148 : tensor<4x8x16xf32>
    %153 = stablehlo.add %142, %151 : tensor<4x8x1xf32>
    %cst_39 = stablehlo.constant dense<1.600000e+01> : tensor<f32>
    %154 = stablehlo.broadcast_in_dim %cst_39, dims = [] : (tensor<f32>) -> tensor<4x8x1xf32>
    %155 = stablehlo.divide %153, %154 : tensor<4x8x1xf32>
    %cst_40 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %156 = stablehlo.reduce(%155 init: %cst_40) applies stablehlo.add across dimensions = [2] : (tensor<4x8x1xf32>, tensor<f32>) -> tensor<4x8xf32>
    %157 = stablehlo.broadcast_in_dim %156, dims = [0, 1] : (tensor<4x8xf32>) -> tensor<4x8x16xf32>
    %158 = stablehlo.add %152, %157 : tensor<4x8x16xf32>
    %159 = stablehlo.dot_general %158, %48, contracting_dims = [0, 1] x [0, 1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<4x8x16xf32>) -> tensor<16x16xf32>
    %160 = stablehlo.transpose %159, dims = [1, 0] : (tensor<16x16xf32>) -> tensor<16x16xf32>
    %161 = stablehlo.dot_general %158, %arg3, contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<16x16xf32>) -> tensor<4x8x16xf32>
    %162 = stablehlo.reshape %161 : (tensor<4x8x16xf32>) -> tensor<4x8x4x4xf32>
    %163 = stablehlo.transpose %162, dims = [0, 2, 3, 1] : (tensor<4x8x4x4xf32>) -> tensor<4x4x4x8xf32>
    %164 = stablehlo.dot_general %163, %28, batching_dims = [0, 1] x [0, 2], contracting_dims = [2] x [3], precision = [DEFAULT, DEFAULT] : (tensor<4x4x4x8xf32>, tensor<4x8x4x4xf32>) -> tensor<4x4x8x8xf32>
    %165 = stablehlo.dot_general %163, %42, batching_dims = [0, 1] x [0, 1], contracting_dims = [3] x [2], precision = [DEFAULT, DEFAULT] : (tensor<4x4x4x8xf32>, tensor<4x4x8x8xf32>) -> tensor<4x4x4x8xf32>
    %166 = stablehlo.transpose %165, dims = [0, 3, 1, 2] : (tensor<4x4x4x8xf32>) -> tensor<4x8x4x4xf32>
    %167 = stablehlo.broadcast_in_dim %45, dims = [0, 1, 2, 3] : (tensor<4x4x8x1xf32>) -> tensor<4x4x8x8xf32>
    %168 = stablehlo.multiply %164, %167 : tensor<4x4x8x8xf32>
    %169 = stablehlo.multiply %168, %38 : tensor<4x4x8x8xf32>
    %cst_41 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %170 = stablehlo.reduce(%169 init: %cst_41) applies stablehlo.add across dimensions = [3] : (tensor<4x4x8x8xf32>, tensor<f32>) -> tensor<4x4x8xf32>
    %171 = stablehlo.reshape %170 : (tensor<4x4x8xf32>) -> tensor<4x4x8x1xf32>
    %172 = stablehlo.negate %171 : tensor<4x4x8x1xf32>
    %173 = stablehlo.broadcast_in_dim %40, dims = [0, 1, 2, 3] : (tensor<4x4x8x1xf32>) -> tensor<4x4x8x8xf32>
    %174 = stablehlo.divide %164, %173 : tensor<4x4x8x8xf32>
    %cst_42 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %175 = stablehlo.reduce(%172 init: %cst_42) applies stablehlo.add across dimensions = [3] : (tensor<4x4x8x1xf32>, tensor<f32>) -> tensor<4x4x8xf32>
    %176 = stablehlo.broadcast_in_dim %175, dims = [0, 1, 2] : (tensor<4x4x8xf32>) -> tensor<4x4x8x8xf32>
    %177 = stablehlo.add %174, %176 : tensor<4x4x8x8xf32>
    %178 = stablehlo.multiply %177, %38 : tensor<4x4x8x8xf32>
    %cst_43 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %179 = stablehlo.broadcast_in_dim %cst_43, dims = [] : (tensor<f32>) -> tensor<4x4x8x8xf32>
    %180 = stablehlo.divide %178, %179 : tensor<4x4x8x8xf32>
    %181 = stablehlo.dot_general %180, %24, batching_dims = [0, 1] x [0, 2], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<4x4x8x8xf32>, tensor<4x8x4x4xf32>) -> tensor<4x4x8x4xf32>
    %182 = stablehlo.transpose %181, dims = [0, 2, 1, 3] : (tensor<4x4x8x4xf32>) -> tensor<4x8x4x4xf32>
    %183 = stablehlo.dot_general %180, %26, batching_dims = [0, 1] x [0, 2], contracting_dims = [3] x [1], precision = [DEFAULT, DEFAULT] : (tensor<4x4x8x8xf32>, tensor<4x8x4x4xf32>) -> tensor<4x4x8x4xf32>
    %184 = stablehlo.transpose %183, dims = [0, 2, 1, 3] : (tensor<4x4x8x4xf32>) -> tensor<4x8x4x4xf32>
    %185 = stablehlo.reshape %166 : (tensor<4x8x4x4xf32>) -> tensor<4x8x16xf32>
    %186 = stablehlo.dot_general %185, %22, contracting_dims = [0, 1] x [0, 1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<4x8x16xf32>) -> tensor<16x16xf32>
    %187 = stablehlo.transpose %186, dims = [1, 0] : (tensor<16x16xf32>) -> tensor<16x16xf32>
    %188 = stablehlo.dot_general %185, %arg2, contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<16x16xf32>) -> tensor<4x8x16xf32>
    %189 = stablehlo.reshape %182 : (tensor<4x8x4x4xf32>) -> tensor<4x8x16xf32>
    %190 = stablehlo.dot_general %189, %22, contracting_dims = [0, 1] x [0, 1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<4x8x16xf32>) -> tensor<16x16xf32>
    %191 = stablehlo.transpose %190, dims = [1, 0] : (tensor<16x16xf32>) -> tensor<16x16xf32>
    %192 = stablehlo.dot_general %189, %arg1, contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<16x16xf32>) -> tensor<4x8x16xf32>
    %193 = stablehlo.add %188, %192 : tensor<4x8x16xf32>
    %194 = stablehlo.reshape %184 : (tensor<4x8x4x4xf32>) -> tensor<4x8x16xf32>
    %195 = stablehlo.dot_general %194, %22, contracting_dims = [0, 1] x [0, 1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<4x8x16xf32>) -> tensor<16x16xf32>
    %196 = stablehlo.transpose %195, dims = [1, 0] : (tensor<16x16xf32>) -> tensor<16x16xf32>
    %197 = stablehlo.dot_general %194, %arg0, contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<4x8x16xf32>, tensor<16x16xf32>) -> tensor<4x8x16xf32>
    %198 = stablehlo.add %193, %197 : tensor<4x8x16xf32>
    %199 = stablehlo.multiply %17, %198 : tensor<4x8x16xf32>
    %cst_44 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %200 = stablehlo.reduce(%199 init: %cst_44) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x8x16xf32>, tensor<f32>) -> tensor<16xf32>
    %201 = stablehlo.reshape %200 : (tensor<16xf32>) -> tensor<1x1x16xf32>
    %cst_45 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %202 = stablehlo.reduce(%201 init: %cst_45) applies stablehlo.add across dimensions = [0, 1] : (tensor<1x1x16xf32>, tensor<f32>) -> tensor<16xf32>
    %203 = stablehlo.add %133, %202 : tensor<16xf32>
    %cst_46 = stablehlo.constant dense<0.00999999977> : tensor<f32>
    %204 = stablehlo.broadcast_in_dim %cst_46, dims = [] : (tensor<f32>) -> tensor<16x16xf32>
    %205 = stablehlo.multiply %204, %196 : tensor<16x16xf32>
    %206 = stablehlo.subtract %arg0, %205 : tensor<16x16xf32>
    %cst_47 = stablehlo.constant dense<0.00999999977> : tensor<f32>
    %207 = stablehlo.broadcast_in_dim %cst_47, dims = [] : (tensor<f32>) -> tensor<16x16xf32>
    %208 = stablehlo.multiply %207, %191 : tensor<16x16xf32>
    %209 = stablehlo.subtract %arg1, %208 : tensor<16x16xf32>
    %cst_48 = stablehlo.constant dense<0.00999999977> : tensor<f32>
    %210 = stablehlo.broadcast_in_dim %cst_48, dims = [] : (tensor<f32>) -> tensor<16x16xf32>
    %211 = stablehlo.multiply %210, %187 : tensor<16x16xf32>
    %212 = stablehlo.subtract %arg2, %211 : tensor<16x16xf32>
    %cst_49 = stablehlo.constant dense<0.00999999977> : tensor<f32>
    %213 = stablehlo.broadcast_in_dim %cst_49, dims = [] : (tensor<f32>) -> tensor<16x16xf32>
    %214 = stablehlo.multiply %213, %160 : tensor<16x16xf32>
    %215 = stablehlo.subtract %arg3, %214 : tensor<16x16xf32>
    %cst_50 = stablehlo.constant dense<0.00999999977> : tensor<f32>
    %216 = stablehlo.broadcast_in_dim %cst_50, dims = [] : (tensor<f32>) -> tensor<16x32xf32>
    %217 = stablehlo.multiply %216, %126 : tensor<16x32xf32>
    %218 = stablehlo.subtract %arg4, %217 : tensor<16x32xf32>
    %cst_51 = stablehlo.constant dense<0.00999999977> : tensor<f32>
    %219 = stablehlo.broadcast_in_dim %cst_51, dims = [] : (tensor<f32>) -> tensor<32x16xf32>
    %220 = stablehlo.multiply %219, %109 : tensor<32x16xf32>
    %221 = stablehlo.subtract %arg5, %220 : tensor<32x16xf32>
    %cst_52 = stablehlo.constant dense<0.00999999977> : tensor<f32>
    %222 = stablehlo.broadcast_in_dim %cst_52, dims = [] : (tensor<f32>) -> tensor<16xf32>
    %223 = stablehlo.multiply %222, %203 : tensor<16xf32>
    %224 = stablehlo.subtract %arg6, %223 : tensor<16xf32>
    return %104, %206, %209, %212, %215, %218, %221, %224 : tensor<f32>, tensor<16x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>, tensor<16x32xf32>, tensor<32x16xf32>, tensor<16xf32>
  }
}
