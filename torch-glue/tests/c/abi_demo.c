/* A C program driving the torch-pjrt engine through its C ABI only (include/torch_pjrt_engine.h):
 * runs a few ops in Strict and DeferAndFuse, reads results, provokes an error, and prints what it
 * saw for tests/c_program.rs to check. */

#include "torch_pjrt_engine.h"

#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                     \
    do {                                                                                \
        int32_t status_ = (call);                                                       \
        if (status_ != TPJRT_OK) {                                                      \
            fprintf(stderr, "%s failed (%d): %s\n", #call, status_, tpjrt_last_error()); \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

enum { FLOAT32 = 6, INT64 = 4 };

static int32_t op_id(const char *name) {
    int32_t id = -1;
    if (tpjrt_op_id(name, &id) != TPJRT_OK) {
        fprintf(stderr, "no op %s: %s\n", name, tpjrt_last_error());
    }
    return id;
}

/* A contiguous 1-d float32 tensor over `storage`. */
static TpjrtTensor vec_f32(uint64_t storage, const int64_t *size, const int64_t *stride) {
    TpjrtTensor t;
    t.storage = storage;
    t.dtype = FLOAT32;
    t.ndim = 1;
    t.sizes = size;
    t.strides = stride;
    t.offset = 0;
    return t;
}

static TpjrtScalar py_float(double x) {
    TpjrtScalar s;
    s.kind = TPJRT_SCALAR_FLOAT;
    s.tensor_dtype = -1;
    s.int_value = 0;
    s.float_value = x;
    return s;
}

static TpjrtOpCall call_of(int32_t op, const TpjrtTensor *inputs, uint64_t n_inputs,
                           const TpjrtScalar *scalars, uint64_t n_scalars, const int64_t *params,
                           uint64_t n_params) {
    TpjrtOpCall c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.inputs = inputs;
    c.num_inputs = n_inputs;
    c.scalars = scalars;
    c.num_scalars = n_scalars;
    c.params = params;
    c.num_params = n_params;
    return c;
}

static void print_values(const char *label, const float *v, int n) {
    printf("%s:", label);
    for (int i = 0; i < n; i++) {
        printf(" %g", (double)v[i]);
    }
    printf("\n");
}

int main(void) {
    CHECK(tpjrt_init(NULL));

    const TpjrtApi *api = tpjrt_api();
    printf("abi version %u, table %s\n", api->version,
           api->struct_size == sizeof(TpjrtApi) ? "matches" : "differs");

    int32_t devices = 0;
    CHECK(tpjrt_device_count(&devices));
    printf("devices: %s\n", devices > 0 ? "some" : "none");

    const int64_t size[1] = {4};
    const int64_t stride[1] = {1};
    const float a_host[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    const float b_host[4] = {10.0f, 20.0f, 30.0f, 40.0f};
    uint64_t sa = 0, sb = 0;
    CHECK(tpjrt_storage_new(sizeof a_host, &sa));
    CHECK(tpjrt_storage_new(sizeof b_host, &sb));
    TpjrtTensor a = vec_f32(sa, size, stride);
    TpjrtTensor b = vec_f32(sb, size, stride);
    CHECK(tpjrt_write_host(&a, a_host, sizeof a_host));
    CHECK(api->write_host(&b, b_host, sizeof b_host));

    /* Strict: c = a + 0.5 * b; d = c * c; s = sum(d). */
    TpjrtTensor ab[2] = {a, b};
    TpjrtScalar alpha = py_float(0.5);
    TpjrtOpCall add = call_of(op_id("add"), ab, 2, &alpha, 1, NULL, 0);
    TpjrtOutput out[2];
    uint64_t n_out = 0;
    CHECK(tpjrt_op(&add, out, 2, &n_out));
    TpjrtTensor c = vec_f32(out[0].storage, size, stride);
    float c_host[4];
    CHECK(tpjrt_read_host(&c, c_host, sizeof c_host));
    print_values("strict add", c_host, 4);

    TpjrtTensor cc[2] = {c, c};
    TpjrtOpCall mul = call_of(op_id("mul"), cc, 2, NULL, 0, NULL, 0);
    CHECK(api->op(&mul, out, 2, &n_out));
    TpjrtTensor d = vec_f32(out[0].storage, size, stride);
    const int64_t sum_params[2] = {0, -1};
    TpjrtOpCall sum = call_of(op_id("sum"), &d, 1, NULL, 0, sum_params, 2);
    CHECK(tpjrt_op(&sum, out, 2, &n_out));
    TpjrtTensor s = {out[0].storage, FLOAT32, 0, NULL, NULL, 0};
    float s_host = 0.0f;
    CHECK(tpjrt_read_host(&s, &s_host, sizeof s_host));
    printf("strict sum of squares: %g (outputs %llu, ndim %d, nbytes %llu)\n", (double)s_host,
           (unsigned long long)n_out, out[0].ndim, (unsigned long long)out[0].nbytes);

    /* DeferAndFuse: e = exp(a - a) * b, deferred until read. */
    CHECK(tpjrt_mode_push(2));
    int32_t mode = -1;
    CHECK(tpjrt_mode_get(&mode));
    TpjrtTensor aa[2] = {a, a};
    TpjrtOpCall sub = call_of(op_id("sub"), aa, 2, NULL, 0, NULL, 0);
    CHECK(tpjrt_op(&sub, out, 2, &n_out));
    TpjrtTensor z = vec_f32(out[0].storage, size, stride);
    TpjrtOpCall ex = call_of(op_id("exp"), &z, 1, NULL, 0, NULL, 0);
    CHECK(tpjrt_op(&ex, out, 2, &n_out));
    TpjrtTensor one = vec_f32(out[0].storage, size, stride);
    TpjrtTensor ob[2] = {one, b};
    TpjrtOpCall mul2 = call_of(op_id("mul"), ob, 2, NULL, 0, NULL, 0);
    CHECK(tpjrt_op(&mul2, out, 2, &n_out));
    TpjrtTensor e = vec_f32(out[0].storage, size, stride);
    float e_host[4];
    CHECK(tpjrt_read_host(&e, e_host, sizeof e_host));
    print_values("deferred exp(a - a) * b", e_host, 4);
    CHECK(tpjrt_mode_pop());
    printf("mode inside: %d\n", mode);

    /* An error: shapes [4] and [3] do not broadcast. */
    const int64_t size3[1] = {3};
    uint64_t s3 = 0;
    CHECK(tpjrt_storage_new(12, &s3));
    TpjrtTensor t3 = vec_f32(s3, size3, stride);
    TpjrtTensor bad[2] = {a, t3};
    TpjrtOpCall add_bad = call_of(op_id("add"), bad, 2, NULL, 0, NULL, 0);
    int32_t status = tpjrt_op(&add_bad, out, 2, &n_out);
    printf("mismatch status %d: %s\n", status, tpjrt_last_error());

    char metrics[4096];
    uint64_t length = 0;
    CHECK(tpjrt_metrics_json(metrics, sizeof metrics, &length));
    printf("metrics json: %s\n",
           (length < sizeof metrics && metrics[0] == '{' && strstr(metrics, "\"deferred_ops\":3"))
               ? "ok"
               : metrics);

    const TpjrtTensor *all[] = {&a, &b, &c, &d, &s, &z, &one, &e, &t3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CHECK(tpjrt_storage_release(all[i]->storage));
    }
    printf("done\n");
    /* The warm-up compile may still run: the runtime must not be torn down under it. */
    CHECK(tpjrt_prepare_exit());
    return 0;
}
