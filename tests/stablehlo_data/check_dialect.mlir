func.func @main() {
  %operand = stablehlo.constant dense<[-2, 0, 2]> : tensor<3xi64>
  %result = stablehlo.abs %operand : tensor<3xi64>
  check.expect_eq_const %result, dense<[2, 0, 2]> : tensor<3xi64>
  %x = "stablehlo.constant"() {value = dense<[1.0, 2.0]> : tensor<2xbf16>} : () -> tensor<2xbf16>
  %y = stablehlo.exponential %x : tensor<2xbf16>
  check.expect_almost_eq_const %y, dense<[2.71875, 7.375]> : tensor<2xbf16>
  func.return
}
