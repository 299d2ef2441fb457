// jax.jit(shard_map(body, mesh, in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None)))
// on a 2x2 mesh, as JAX 0.10 prints it (Shardy): psum over "y", all_gather and ppermute
// over "x" inside the manual region.
module @jit_body attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=2, "y"=2]> {stablehlo.mesh = {axes = [{name = "x", size = 2 : i64}, {name = "y", size = 2 : i64}]}}
  func.func public @main(%arg0: tensor<8x16xf32>, %arg1: tensor<16x4xf32>) -> (tensor<2x4xf32> {jax.result_info = "result"}) {
    %0 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{"x"}, {"y"}]>, <@mesh, [{"y"}, {}]>] out_shardings=[<@mesh, [{"x"}, {}]>] manual_axes={"x", "y"} (%arg2: tensor<4x8xf32>, %arg3: tensor<8x4xf32>) {
      %1 = stablehlo.dot_general %arg2, %arg3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
      %2 = "stablehlo.all_reduce"(%1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, use_global_device_ids}> ({
      ^bb0(%arg4: tensor<f32>, %arg5: tensor<f32>):
        %9 = stablehlo.add %arg4, %arg5 : tensor<f32>
        stablehlo.return %9 : tensor<f32>
      }) : (tensor<4x4xf32>) -> tensor<4x4xf32>
      %3 = "stablehlo.all_gather"(%2) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>, use_global_device_ids}> : (tensor<4x4xf32>) -> tensor<8x4xf32>
      %4 = "stablehlo.collective_permute"(%2) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 2], [2, 0], [1, 3], [3, 1]]> : tensor<4x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
      %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %5 = stablehlo.reduce(%3 init: %cst) applies stablehlo.add across dimensions = [0] : (tensor<8x4xf32>, tensor<f32>) -> tensor<4xf32>
      %6 = stablehlo.broadcast_in_dim %5, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32>
      %7 = stablehlo.slice %4 [0:1, 0:4] : (tensor<4x4xf32>) -> tensor<1x4xf32>
      %8 = stablehlo.add %6, %7 : tensor<1x4xf32>
      sdy.return %8 : tensor<1x4xf32>
    } : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
}
