/* bias_add.c: a CPU custom call for xlapy, API_VERSION_STATUS_RETURNING_UNIFIED.
 *
 *   out[i] = bias[i % bias_len] + x[i]      bias: f32[bias_len], x, out: f32[n]
 *
 * The sizes travel in the opaque string ("bias_len,n"), set when the call is built: a C
 * target sees raw pointers, not shapes. Problems are reported through the status, which
 * xlapy turns into a CustomCallError carrying the message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xlapy_custom_call.h"

void bias_add(void* out, const void** ins, const char* opaque, size_t opaque_len,
              XlaCustomCallStatus* status) {
  char text[64];
  long bias_len = 0, n = 0;
  if (opaque_len >= sizeof text) {
    xlapy_custom_call_status_set_failure(status, "opaque string too long", 22);
    return;
  }
  memcpy(text, opaque, opaque_len);
  text[opaque_len] = '\0';
  if (sscanf(text, "%ld,%ld", &bias_len, &n) != 2 || bias_len <= 0 || n < 0) {
    char message[128];
    int len = snprintf(message, sizeof message, "bias_add: bad opaque '%s', want 'bias_len,n'",
                       text);
    xlapy_custom_call_status_set_failure(status, message, (size_t)len);
    return;
  }
  const float* bias = (const float*)ins[0];
  const float* x = (const float*)ins[1];
  float* result = (float*)out;
  for (long i = 0; i < n; ++i) result[i] = bias[i % bias_len] + x[i];
}
