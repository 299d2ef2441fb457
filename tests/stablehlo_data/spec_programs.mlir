// Programs in the style of StableHLO's interpreter tests: each function builds its inputs
// as constants and checks its results with check.* ops. The dashed comment lines separate
// the programs; each is imported and run on its own.

func.func @while_sum() {
  %i0 = stablehlo.constant dense<0> : tensor<i64>
  %one = stablehlo.constant dense<1> : tensor<i64>
  %ten = stablehlo.constant dense<10> : tensor<i64>
  %r0, %r1 = stablehlo.while(%i = %i0, %s = %i0) : tensor<i64>, tensor<i64>
  cond {
    %c = stablehlo.compare LT, %i, %ten : (tensor<i64>, tensor<i64>) -> tensor<i1>
    stablehlo.return %c : tensor<i1>
  } do {
    %s1 = stablehlo.add %s, %i : tensor<i64>
    %i1 = stablehlo.add %i, %one : tensor<i64>
    stablehlo.return %i1, %s1 : tensor<i64>, tensor<i64>
  }
  check.expect_eq_const %r0, dense<10> : tensor<i64>
  check.expect_eq_const %r1, dense<45> : tensor<i64>
  func.return
}

// -----

func.func @case_with_captures() {
  %index = stablehlo.constant dense<1> : tensor<i32>
  %a = stablehlo.constant dense<[1, 2]> : tensor<2xi64>
  %b = stablehlo.constant dense<[10, 20]> : tensor<2xi64>
  %r = "stablehlo.case"(%index) ({
    stablehlo.return %a : tensor<2xi64>
  }, {
    %s = stablehlo.add %a, %b : tensor<2xi64>
    stablehlo.return %s : tensor<2xi64>
  }) : (tensor<i32>) -> tensor<2xi64>
  check.expect_eq_const %r, dense<[11, 22]> : tensor<2xi64>
  func.return
}

// -----

func.func @if_false() {
  %p = stablehlo.constant dense<false> : tensor<i1>
  %x = stablehlo.constant dense<[1.5, -2.0]> : tensor<2xf32>
  %r = "stablehlo.if"(%p) ({
    stablehlo.return %x : tensor<2xf32>
  }, {
    %n = stablehlo.negate %x : tensor<2xf32>
    stablehlo.return %n : tensor<2xf32>
  }) : (tensor<i1>) -> tensor<2xf32>
  check.expect_eq_const %r, dense<[-1.5, 2.0]> : tensor<2xf32>
  func.return
}

// -----

func.func @reduce_two_results() {
  %x = stablehlo.constant dense<[[1.0, 7.0, 3.0], [4.0, 2.0, 9.0]]> : tensor<2x3xf32>
  %i = stablehlo.iota dim = 1 : tensor<2x3xi32>
  %z = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %zi = stablehlo.constant dense<0> : tensor<i32>
  %m:2 = stablehlo.reduce(%x init: %z), (%i init: %zi) across dimensions = [1] : (tensor<2x3xf32>, tensor<2x3xi32>, tensor<f32>, tensor<i32>) -> (tensor<2xf32>, tensor<2xi32>)
   reducer(%a: tensor<f32>, %b: tensor<f32>) (%ai: tensor<i32>, %bi: tensor<i32>) {
    %gt = stablehlo.compare GT, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %v = stablehlo.select %gt, %a, %b : tensor<i1>, tensor<f32>
    %w = stablehlo.select %gt, %ai, %bi : tensor<i1>, tensor<i32>
    stablehlo.return %v, %w : tensor<f32>, tensor<i32>
  }
  check.expect_eq_const %m#0, dense<[7.0, 9.0]> : tensor<2xf32>
  check.expect_eq_const %m#1, dense<[1, 2]> : tensor<2xi32>
  func.return
}

// -----

func.func @sort_descending_with_payload() {
  %k = stablehlo.constant dense<[3, 1, 2]> : tensor<3xi32>
  %v = stablehlo.constant dense<[30.0, 10.0, 20.0]> : tensor<3xf32>
  %r:2 = "stablehlo.sort"(%k, %v) <{dimension = 0 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<i32>, %b: tensor<i32>, %c: tensor<f32>, %d: tensor<f32>):
    %gt = stablehlo.compare GT, %a, %b, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %gt : tensor<i1>
  }) : (tensor<3xi32>, tensor<3xf32>) -> (tensor<3xi32>, tensor<3xf32>)
  check.expect_eq_const %r#0, dense<[3, 2, 1]> : tensor<3xi32>
  check.expect_eq_const %r#1, dense<[30.0, 20.0, 10.0]> : tensor<3xf32>
  func.return
}

// -----

func.func @integer_extremes() {
  %u = stablehlo.constant dense<[0, 9223372036854775807, 18446744073709551615]> : tensor<3xui64>
  %n = stablehlo.not %u : tensor<3xui64>
  check.expect_eq_const %n, dense<[18446744073709551615, 9223372036854775808, 0]> : tensor<3xui64>
  %s = stablehlo.constant dense<[-8, 7, -1]> : tensor<3xi4>
  %t = stablehlo.negate %s : tensor<3xi4>
  check.expect_eq_const %t, dense<[-8, -7, 1]> : tensor<3xi4>
  func.return
}

// -----

func.func @float_formats() {
  %h = stablehlo.constant dense<"0x0000803F00000040"> : tensor<2xf32>
  check.expect_eq_const %h, dense<[1.0, 2.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.5, -2.25]> : tensor<2xbf16>
  %f = stablehlo.convert %b : (tensor<2xbf16>) -> tensor<2xf8E4M3FN>
  %g = stablehlo.convert %f : (tensor<2xf8E4M3FN>) -> tensor<2xf32>
  check.expect_eq_const %g, dense<[1.5, -2.25]> : tensor<2xf32>
  %c = stablehlo.constant dense<[(1.0, 2.0), (0.0, -1.0)]> : tensor<2xcomplex<f32>>
  %r = stablehlo.real %c : (tensor<2xcomplex<f32>>) -> tensor<2xf32>
  %i = stablehlo.imag %c : (tensor<2xcomplex<f32>>) -> tensor<2xf32>
  check.expect_eq_const %r, dense<[1.0, 0.0]> : tensor<2xf32>
  check.expect_eq_const %i, dense<[2.0, -1.0]> : tensor<2xf32>
  %nan = stablehlo.constant dense<0x7FC00000> : tensor<f32>
  %isnan = stablehlo.compare NE, %nan, %nan : (tensor<f32>, tensor<f32>) -> tensor<i1>
  check.expect_eq_const %isnan, dense<true> : tensor<i1>
  func.return
}

// -----

func.func @tuples() {
  %a = stablehlo.constant dense<1> : tensor<i64>
  %b = stablehlo.constant dense<[2.0]> : tensor<1xf32>
  %t = stablehlo.tuple %a, %b : tuple<tensor<i64>, tensor<1xf32>>
  %x = stablehlo.get_tuple_element %t[1] : (tuple<tensor<i64>, tensor<1xf32>>) -> tensor<1xf32>
  check.expect_eq_const %x, dense<[2.0]> : tensor<1xf32>
  func.return
}

// -----

func.func @shape_ops() {
  %x = stablehlo.constant dense<[[1, 2, 3], [4, 5, 6]]> : tensor<2x3xi32>
  %t = stablehlo.transpose %x, dims = [1, 0] : (tensor<2x3xi32>) -> tensor<3x2xi32>
  check.expect_eq_const %t, dense<[[1, 4], [2, 5], [3, 6]]> : tensor<3x2xi32>
  %s = stablehlo.slice %x [0:2, 1:3:1] : (tensor<2x3xi32>) -> tensor<2x2xi32>
  check.expect_eq_const %s, dense<[[2, 3], [5, 6]]> : tensor<2x2xi32>
  %r = stablehlo.reverse %x, dims = [1] : tensor<2x3xi32>
  check.expect_eq_const %r, dense<[[3, 2, 1], [6, 5, 4]]> : tensor<2x3xi32>
  %c = stablehlo.concatenate %x, %x, dim = 0 : (tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<4x3xi32>
  %p = stablehlo.constant dense<0> : tensor<i32>
  %padded = stablehlo.pad %x, %p, low = [0, 1], high = [1, 0], interior = [0, 0] : (tensor<2x3xi32>, tensor<i32>) -> tensor<3x4xi32>
  check.expect_eq_const %padded, dense<[[0, 1, 2, 3], [0, 4, 5, 6], [0, 0, 0, 0]]> : tensor<3x4xi32>
  %b = stablehlo.broadcast_in_dim %x, dims = [1, 2] : (tensor<2x3xi32>) -> tensor<2x2x3xi32>
  %one = stablehlo.constant dense<[[7], [8]]> : tensor<2x1xi32>
  %e = stablehlo.broadcast_in_dim %one, dims = [0, 1] : (tensor<2x1xi32>) -> tensor<2x3xi32>
  check.expect_eq_const %e, dense<[[7, 7, 7], [8, 8, 8]]> : tensor<2x3xi32>
  func.return
}

// -----

func.func @dynamic_pad_and_mulhi() {
  %x = stablehlo.constant dense<[1, 2]> : tensor<2xi64>
  %v = stablehlo.constant dense<-1> : tensor<i64>
  %lo = stablehlo.constant dense<[1]> : tensor<1xi64>
  %hi = stablehlo.constant dense<[0]> : tensor<1xi64>
  %in = stablehlo.constant dense<[1]> : tensor<1xi64>
  %r = stablehlo.dynamic_pad %x, %v, %lo, %hi, %in : (tensor<2xi64>, tensor<i64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<4xi64>
  check.expect_eq_const %r, dense<[-1, 1, -1, 2]> : tensor<4xi64>
  %a = stablehlo.constant dense<[64, -64]> : tensor<2xi8>
  %b = stablehlo.constant dense<[4, 4]> : tensor<2xi8>
  %m = "chlo.mulhi"(%a, %b) : (tensor<2xi8>, tensor<2xi8>) -> tensor<2xi8>
  check.expect_eq_const %m, dense<[1, -1]> : tensor<2xi8>
  func.return
}

// -----

func.func @dot_and_convolution() {
  %a = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
  %d = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  check.expect_almost_eq_const %d, dense<[[7.0, 10.0], [15.0, 22.0]]> : tensor<2x2xf32>
  %x = stablehlo.constant dense<[[[[1.0], [2.0], [3.0]]]]> : tensor<1x1x3x1xf32>
  %w = stablehlo.constant dense<[[[[1.0]], [[1.0]]]]> : tensor<1x2x1x1xf32>
  %c = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x1x3x1xf32>, tensor<1x2x1x1xf32>) -> tensor<1x1x2x1xf32>
  check.expect_almost_eq_const %c, dense<[[[[3.0], [5.0]]]]> : tensor<1x1x2x1xf32>
  func.return
}

// -----

func.func @gather_and_scatter() {
  %x = stablehlo.constant dense<[10, 20, 30, 40]> : tensor<4xi32>
  %i = stablehlo.constant dense<[[3], [0]]> : tensor<2x1xi32>
  %g = "stablehlo.gather"(%x, %i) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1>}> : (tensor<4xi32>, tensor<2x1xi32>) -> tensor<2xi32>
  check.expect_eq_const %g, dense<[40, 10]> : tensor<2xi32>
  %u = stablehlo.constant dense<[1, 2]> : tensor<2xi32>
  %s = "stablehlo.scatter"(%x, %i, %u) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%p: tensor<i32>, %q: tensor<i32>):
    %sum = stablehlo.add %p, %q : tensor<i32>
    stablehlo.return %sum : tensor<i32>
  }) : (tensor<4xi32>, tensor<2x1xi32>, tensor<2xi32>) -> tensor<4xi32>
  check.expect_eq_const %s, dense<[12, 20, 30, 41]> : tensor<4xi32>
  func.return
}

// -----

func.func @windows() {
  %x = stablehlo.constant dense<[1.0, 5.0, 2.0, 4.0]> : tensor<4xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %s = "stablehlo.reduce_window"(%x, %z) <{window_dimensions = array<i64: 2>, window_strides = array<i64: 2>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %m = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %m : tensor<f32>
  }) : (tensor<4xf32>, tensor<f32>) -> tensor<2xf32>
  check.expect_eq_const %s, dense<[6.0, 6.0]> : tensor<2xf32>
  %src = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %g = "stablehlo.select_and_scatter"(%x, %src, %z) <{window_dimensions = array<i64: 2>, window_strides = array<i64: 2>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %ge = stablehlo.compare GE, %a, %b : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %ge : tensor<i1>
  }, {
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %m = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %m : tensor<f32>
  }) : (tensor<4xf32>, tensor<2xf32>, tensor<f32>) -> tensor<4xf32>
  check.expect_eq_const %g, dense<[0.0, 1.0, 0.0, 2.0]> : tensor<4xf32>
  func.return
}

// -----

func.func @composite_and_call() {
  %x = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %y = stablehlo.composite "my.double" %x {decomposition = @double} : (tensor<2xf32>) -> tensor<2xf32>
  %z = func.call @double(%y) : (tensor<2xf32>) -> tensor<2xf32>
  check.expect_eq_const %z, dense<[4.0, 8.0]> : tensor<2xf32>
  func.return
}

func.func private @double(%a: tensor<2xf32>) -> tensor<2xf32> {
  %r = stablehlo.add %a, %a : tensor<2xf32>
  func.return %r : tensor<2xf32>
}

// -----

func.func @atan2_logistic_tan() {
  %y = stablehlo.constant dense<[1.0, -1.0]> : tensor<2xf64>
  %x = stablehlo.constant dense<[1.0, 0.0]> : tensor<2xf64>
  %a = stablehlo.atan2 %y, %x : tensor<2xf64>
  check.expect_almost_eq_const %a, dense<[0.78539816339744828, -1.5707963267948966]> : tensor<2xf64>
  %z = stablehlo.constant dense<[0.0]> : tensor<1xf32>
  %l = stablehlo.logistic %z : tensor<1xf32>
  check.expect_eq_const %l, dense<[0.5]> : tensor<1xf32>
  %t = chlo.tan %x : tensor<2xf64> -> tensor<2xf64>
  check.expect_almost_eq_const %t, dense<[1.5574077246549023, 0.0]> : tensor<2xf64>
  func.return
}

// -----

func.func @dot_map_batch_norm() {
  %a = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %d = "stablehlo.dot"(%a, %a) : (tensor<3xf32>, tensor<3xf32>) -> tensor<f32>
  check.expect_eq_const %d, dense<14.0> : tensor<f32>
  %m = "stablehlo.map"(%a, %a) <{dimensions = array<i64: 0>}> ({
  ^bb0(%p: tensor<f32>, %q: tensor<f32>):
    %r = stablehlo.multiply %p, %q : tensor<f32>
    stablehlo.return %r : tensor<f32>
  }) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
  check.expect_eq_const %m, dense<[1.0, 4.0, 9.0]> : tensor<3xf32>
  %x = stablehlo.constant dense<[[1.0, 2.0], [3.0, 6.0]]> : tensor<2x2xf32>
  %scale = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %offset = stablehlo.constant dense<[0.0, 1.0]> : tensor<2xf32>
  %mean = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %var = stablehlo.constant dense<[1.0, 4.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%x, %scale, %offset, %mean, %var) <{epsilon = 0.0 : f32, feature_index = 1 : i64}> : (tensor<2x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<2x2xf32>
  check.expect_almost_eq_const %bn, dense<[[-1.0, -1.0], [1.0, 3.0]]> : tensor<2x2xf32>
  %n, %bm, %bv = "stablehlo.batch_norm_training"(%x, %scale, %offset) <{epsilon = 0.0 : f32, feature_index = 1 : i64}> : (tensor<2x2xf32>, tensor<2xf32>, tensor<2xf32>) -> (tensor<2x2xf32>, tensor<2xf32>, tensor<2xf32>)
  check.expect_almost_eq_const %n, dense<[[-1.0, -1.0], [1.0, 3.0]]> : tensor<2x2xf32>
  check.expect_almost_eq_const %bm, dense<[2.0, 4.0]> : tensor<2xf32>
  check.expect_almost_eq_const %bv, dense<[1.0, 4.0]> : tensor<2xf32>
  func.return
}

// -----

func.func @dynamic_ops_with_constant_shapes() {
  %x = stablehlo.constant dense<[1, 2]> : tensor<2xi32>
  %shape = stablehlo.constant dense<[3, 2]> : tensor<2xi64>
  %b = stablehlo.dynamic_broadcast_in_dim %x, %shape, dims = [1] : (tensor<2xi32>, tensor<2xi64>) -> tensor<3x2xi32>
  check.expect_eq_const %b, dense<[[1, 2], [1, 2], [1, 2]]> : tensor<3x2xi32>
  %n = stablehlo.constant dense<[4]> : tensor<1xi64>
  %i = stablehlo.dynamic_iota %n, dim = 0 : (tensor<1xi64>) -> tensor<4xi32>
  check.expect_eq_const %i, dense<[0, 1, 2, 3]> : tensor<4xi32>
  %s = stablehlo.constant dense<[2, 1]> : tensor<2xi64>
  %r = stablehlo.dynamic_reshape %x, %s : (tensor<2xi32>, tensor<2xi64>) -> tensor<2x1xi32>
  check.expect_eq_const %r, dense<[[1], [2]]> : tensor<2x1xi32>
  %d = stablehlo.get_dimension_size %b, dim = 0 : (tensor<3x2xi32>) -> tensor<i32>
  check.expect_eq_const %d, dense<3> : tensor<i32>
  %op = stablehlo.constant dense<[10, 20, 30, 40]> : tensor<4xi32>
  %idx = stablehlo.constant dense<[[2]]> : tensor<1x1xi32>
  %sizes = stablehlo.constant dense<[2]> : tensor<1xi64>
  %g = "stablehlo.dynamic_gather"(%op, %idx, %sizes) {dimension_numbers = #stablehlo.gather<offset_dims = [1], start_index_map = [0], index_vector_dim = 1>} : (tensor<4xi32>, tensor<1x1xi32>, tensor<1xi64>) -> tensor<1x2xi32>
  check.expect_eq_const %g, dense<[[30, 40]]> : tensor<1x2xi32>
  %lhs = stablehlo.constant dense<[[[[1.0], [2.0], [3.0]]]]> : tensor<1x1x3x1xf32>
  %rhs = stablehlo.constant dense<1.0> : tensor<1x2x1x1xf32>
  %pad = stablehlo.constant dense<[[0, 0], [1, 0]]> : tensor<2x2xi64>
  %c = "stablehlo.dynamic_conv"(%lhs, %rhs, %pad) {dimension_numbers = #stablehlo.conv<[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]>, batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x1x3x1xf32>, tensor<1x2x1x1xf32>, tensor<2x2xi64>) -> tensor<1x1x3x1xf32>
  check.expect_eq_const %c, dense<[[[[1.0], [3.0], [5.0]]]]> : tensor<1x1x3x1xf32>
  func.return
}

// -----

func.func @one_device_collectives_and_rng() {
  %x = stablehlo.constant dense<[[1.0, 2.0]]> : tensor<1x2xf32>
  %a = "stablehlo.all_to_all"(%x) <{split_dimension = 1 : i64, concat_dimension = 1 : i64, split_count = 1 : i64, replica_groups = dense<[[0]]> : tensor<1x1xi64>}> : (tensor<1x2xf32>) -> tensor<1x2xf32>
  check.expect_eq_const %a, dense<[[1.0, 2.0]]> : tensor<1x2xf32>
  %b = "stablehlo.collective_broadcast"(%x) <{replica_groups = dense<[[0]]> : tensor<1x1xi64>}> : (tensor<1x2xf32>) -> tensor<1x2xf32>
  check.expect_eq_const %b, dense<[[1.0, 2.0]]> : tensor<1x2xf32>
  %id = stablehlo.replica_id : tensor<ui32>
  check.expect_eq_const %id, dense<0> : tensor<ui32>
  %token = stablehlo.after_all : !stablehlo.token
  %lo = stablehlo.constant dense<-1.0> : tensor<f32>
  %hi = stablehlo.constant dense<1.0> : tensor<f32>
  %shape = stablehlo.constant dense<[3]> : tensor<1xi64>
  %u = stablehlo.rng %lo, %hi, %shape, distribution = UNIFORM : (tensor<f32>, tensor<f32>, tensor<1xi64>) -> tensor<3xf32>
  %clamped = stablehlo.clamp %lo, %u, %hi : (tensor<f32>, tensor<3xf32>, tensor<f32>) -> tensor<3xf32>
  check.expect_eq %clamped, %u : tensor<3xf32>
  func.return
}
