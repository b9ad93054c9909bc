// FAKE host-memory implementation of the declarations in tests/fake_acl/, for testing bsa's harness in CI.
// NOT CANN and not the operator: "device" memory is host memory, and the toy backward copies
// query/key/value into dq/dk/dv after its interface checks (161001 for null inputs or missing TND
// lengths, 161002 for bad layouts or dtypes); the forward makes its checks and computes a CPU forward
// (float, dense softmax over each row's selected kv columns) so a chain runs end to end. It counts every acl resource and prints, at exit,
//     fake_acl report: init=0 device=0 streams=0 buffers=0 tensors=0 int_arrays=0 executors=0
// (the live count of each), so a test can check the harness frees everything on every path.
// FAKE_ACL_FAIL=<function>:<n> makes the n-th call of that function fail (error 507899, or nullptr).
// FAKE_ACLNN_RUN_STATUS=<code> makes aclnnBlockSparseAttentionGrad return that status.
// Time: each operator call (backward or forward) advances a fake device clock by FAKE_ACL_KERNEL_US
// microseconds (the environment's, else the build's -DFAKE_ACL_KERNEL_US, else 100), which events record;
// FAKE_ACL_SLOW_CALL=<n> makes the n-th call take ten times as long (an outlier).
// FAKE_ACL_WRITE_PAST_END=<output>:<count> makes the backward write <count> elements of zero bytes past the
// end of dq, dk or dv (a kernel that writes outside its tensor, for the harness's guard zones).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnn_block_sparse_attention.h"
#include "aclnn_block_sparse_attention_grad.h"

struct aclTensor {
    std::vector<int64_t> dims;
    aclDataType dtype;
    void *data;
};
struct aclIntArray {
    std::vector<int64_t> values;
};
struct ForwardExecutor;  // the forward's executor (defined with the forward below)

struct aclOpExecutor {
    const aclTensor *inputs[3];
    aclTensor *outputs[3];
    uint64_t workspaceSize;
};

namespace {

constexpr aclError kFakeError = 507899;

#ifndef FAKE_ACL_KERNEL_US
#define FAKE_ACL_KERNEL_US 100
#endif

struct Counters {
    long init = 0, device = 0, streams = 0, buffers = 0, tensors = 0, intArrays = 0, executors = 0, events = 0;
    std::map<std::string, long> calls;
    ~Counters()
    {
        std::fprintf(stderr,
                     "fake_acl report: init=%ld device=%ld streams=%ld buffers=%ld tensors=%ld int_arrays=%ld "
                     "executors=%ld events=%ld\n",
                     init, device, streams, buffers, tensors, intArrays, executors, events);
    }
};
Counters counters;
std::string recentError;
std::vector<ForwardExecutor *> forwardExecutors;  // live forward executors (told apart from the backward's)

// True when FAKE_ACL_FAIL names this call.
bool ShouldFail(const char *function)
{
    const long call = ++counters.calls[function];
    const char *spec = std::getenv("FAKE_ACL_FAIL");
    if (spec == nullptr) {
        return false;
    }
    const std::string text(spec);
    const size_t colon = text.find(':');
    const std::string name = text.substr(0, colon);
    const long nth = colon == std::string::npos ? 1 : std::atol(text.c_str() + colon + 1);
    if (name == function && call == nth) {
        recentError = std::string("fake failure of ") + function;
        return true;
    }
    return false;
}

size_t Bytes(const aclTensor *tensor)
{
    size_t count = 1;
    for (int64_t dim : tensor->dims) {
        count *= static_cast<size_t>(dim);
    }
    switch (tensor->dtype) {
        case ACL_FLOAT16:
        case ACL_BF16:
            return count * 2;
        case ACL_FLOAT:
            return count * 4;
        case ACL_DOUBLE:
        case ACL_INT64:
            return count * 8;
        default:
            return count;
    }
}

// The fake device clock, in microseconds: an operator call advances it (`Launched`), an event records it.
double deviceClockUs = 0.0;
long operatorCalls = 0;

void Launched()
{
    double micros = FAKE_ACL_KERNEL_US;
    if (const char *text = std::getenv("FAKE_ACL_KERNEL_US")) {
        micros = std::atof(text);
    }
    const char *slow = std::getenv("FAKE_ACL_SLOW_CALL");
    deviceClockUs += ++operatorCalls == (slow ? std::atol(slow) : -1) ? 10 * micros : micros;
}

struct FakeEvent {
    double stampUs = -1.0;  // -1: never recorded
};

aclnnStatus Reject(aclnnStatus status, const char *why)
{
    recentError = why;
    return status;
}

}  // namespace

extern "C" {

const char *aclGetRecentErrMsg() { return recentError.c_str(); }

aclError aclInit(const char *) { return ShouldFail("aclInit") ? kFakeError : (++counters.init, ACL_SUCCESS); }
aclError aclFinalize() { return --counters.init, ACL_SUCCESS; }
aclError aclrtSetDevice(int32_t)
{
    return ShouldFail("aclrtSetDevice") ? kFakeError : (++counters.device, ACL_SUCCESS);
}
aclError aclrtResetDevice(int32_t) { return --counters.device, ACL_SUCCESS; }

aclError aclrtCtxSetSysParamOpt(aclSysParamOpt opt, int64_t value)
{
    if (ShouldFail("aclrtCtxSetSysParamOpt")) {
        return kFakeError;
    }
    if (counters.device <= 0) {  // context-scoped: a context exists only after aclrtSetDevice
        recentError = "aclrtCtxSetSysParamOpt before aclrtSetDevice: no current context";
        return kFakeError;
    }
    std::fprintf(stderr, "fake_acl: aclrtCtxSetSysParamOpt(%d, %lld)\n", static_cast<int>(opt),
                 static_cast<long long>(value));
    return ACL_SUCCESS;
}

aclError aclrtCreateStream(aclrtStream *stream)
{
    if (ShouldFail("aclrtCreateStream")) {
        return kFakeError;
    }
    *stream = new int(0);
    ++counters.streams;
    return ACL_SUCCESS;
}
aclError aclrtDestroyStream(aclrtStream stream)
{
    delete static_cast<int *>(stream);
    --counters.streams;
    return ACL_SUCCESS;
}
aclError aclrtSynchronizeStream(aclrtStream) { return ShouldFail("aclrtSynchronizeStream") ? kFakeError : 0; }

aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy)
{
    if (size == 0 || ShouldFail("aclrtMalloc")) {
        return kFakeError;
    }
    *devPtr = std::malloc(size);
    ++counters.buffers;
    return ACL_SUCCESS;
}
aclError aclrtFree(void *devPtr)
{
    std::free(devPtr);
    --counters.buffers;
    return ACL_SUCCESS;
}
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind)
{
    if (count > destMax || ShouldFail("aclrtMemcpy")) {
        return kFakeError;
    }
    std::memcpy(dst, src, count);
    return ACL_SUCCESS;
}
aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count)
{
    if (count > maxCount || ShouldFail("aclrtMemset")) {
        return kFakeError;
    }
    std::memset(devPtr, value, count);
    return ACL_SUCCESS;
}

aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag)
{
    if (ShouldFail("aclrtCreateEventWithFlag") || flag != ACL_EVENT_TIME_LINE) {
        return kFakeError;
    }
    *event = new FakeEvent;
    ++counters.events;
    return ACL_SUCCESS;
}
aclError aclrtDestroyEvent(aclrtEvent event)
{
    delete static_cast<FakeEvent *>(event);
    --counters.events;
    return ACL_SUCCESS;
}
aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream)
{
    if (ShouldFail("aclrtRecordEvent") || event == nullptr || stream == nullptr) {
        return kFakeError;
    }
    static_cast<FakeEvent *>(event)->stampUs = deviceClockUs;
    return ACL_SUCCESS;
}
aclError aclrtSynchronizeEvent(aclrtEvent event)
{
    return ShouldFail("aclrtSynchronizeEvent") || event == nullptr ? kFakeError : ACL_SUCCESS;
}
aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent)
{
    const auto *start = static_cast<FakeEvent *>(startEvent), *end = static_cast<FakeEvent *>(endEvent);
    if (ShouldFail("aclrtEventElapsedTime") || start->stampUs < 0 || end->stampUs < 0) {
        return kFakeError;
    }
    *ms = static_cast<float>((end->stampUs - start->stampUs) / 1000.0);
    return ACL_SUCCESS;
}

aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType, const int64_t *,
                           int64_t, aclFormat, const int64_t *, uint64_t, void *tensorData)
{
    if (ShouldFail("aclCreateTensor")) {
        return nullptr;
    }
    ++counters.tensors;
    return new aclTensor{std::vector<int64_t>(viewDims, viewDims + viewDimsNum), dataType, tensorData};
}
aclnnStatus aclDestroyTensor(const aclTensor *tensor)
{
    delete tensor;
    --counters.tensors;
    return 0;
}
aclIntArray *aclCreateIntArray(const int64_t *value, uint64_t size)
{
    if (ShouldFail("aclCreateIntArray")) {
        return nullptr;
    }
    ++counters.intArrays;
    return new aclIntArray{std::vector<int64_t>(value, value + size)};
}
aclnnStatus aclDestroyIntArray(const aclIntArray *array)
{
    delete array;
    --counters.intArrays;
    return 0;
}

void DeleteForwardExecutor(ForwardExecutor *executor);

aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor)
{
    if (executor == nullptr) {
        return 561103;
    }
    auto forward = std::find(forwardExecutors.begin(), forwardExecutors.end(),
                             reinterpret_cast<ForwardExecutor *>(executor));
    if (forward != forwardExecutors.end()) {
        forwardExecutors.erase(forward);
        DeleteForwardExecutor(reinterpret_cast<ForwardExecutor *>(executor));
        --counters.executors;
        return 0;
    }
    delete executor;
    --counters.executors;
    return 0;
}

static std::string Join(const aclIntArray *array)
{
    if (array == nullptr) {
        return "null";
    }
    std::string text;
    for (int64_t value : array->values) {
        text += (text.empty() ? "" : ",") + std::to_string(value);
    }
    return "[" + text + "]";
}

aclnnStatus aclnnBlockSparseAttentionGradGetWorkspaceSize(
    const aclTensor *dout, const aclTensor *query, const aclTensor *key, const aclTensor *value,
    const aclTensor *attentionOut, const aclTensor *softmaxLse, const aclTensor *blockSparseMaskOptional,
    const aclTensor *attenMaskOptional, const aclIntArray *blockShapeOptional,
    const aclIntArray *actualSeqLengthsOptional, const aclIntArray *actualSeqLengthsKvOptional, char *qInputLayout,
    char *kvInputLayout, int64_t numKeyValueHeads, int64_t maskType, double scaleValue, int64_t preTokens,
    int64_t nextTokens, aclTensor *dq, aclTensor *dk, aclTensor *dv, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    (void)numKeyValueHeads;
    // The checks of ops-transformer master (5778144) in their order: a null layout first (d42799fe6),
    // ValidateParams (op_host/op_api/aclnn_block_sparse_attention_grad.cpp), then the A2/A3 tiling (561002).
    // Written apart from bsa_cli/ops/interface.py on purpose: running the negative suite through the harness and
    // this fake checks both, and that the harness passes every tensor, null and list as the case says.
    if (qInputLayout == nullptr || kvInputLayout == nullptr) {
        return Reject(161002, "fake: qInputLayout or kvInputLayout is null");
    }
    const std::string qLayout(qInputLayout), kvLayout(kvInputLayout);
    const aclTensor *mandatory[] = {dout, query, key, value, attentionOut, softmaxLse, blockSparseMaskOptional};
    for (const aclTensor *tensor : mandatory) {
        if (tensor == nullptr) {
            return Reject(161001, "fake: a mandatory tensor is null");
        }
    }
    const aclDataType q = query->dtype;
    if (q != ACL_FLOAT16 && q != ACL_BF16) {
        return Reject(161002, "fake: query dtype must be float16 or bfloat16");
    }
    for (const aclTensor *tensor : {key, value, attentionOut, dout}) {
        if (tensor->dtype != q) {
            return Reject(161002, "fake: key/value/attentionOut/dout dtype differs from query");
        }
    }
    if (softmaxLse->dtype != ACL_FLOAT) {
        return Reject(161002, "fake: softmaxLse dtype must be float32");
    }
    if (blockSparseMaskOptional->dtype != ACL_BOOL && blockSparseMaskOptional->dtype != ACL_UINT8) {
        return Reject(161002, "fake: blockSparseMask dtype must be bool or uint8");
    }
    for (const aclTensor *tensor : {dq, dk, dv}) {
        if (tensor->dtype != q) {
            return Reject(161002, "fake: dq/dk/dv dtype differs from query");
        }
    }
    auto dim = [](const aclTensor *tensor, size_t axis) { return tensor->dims.at(axis); };
    if (qLayout == "TND") {
        for (const aclTensor *tensor : {key, value, attentionOut, dout, (const aclTensor *)dq, (const aclTensor *)dk,
                                        (const aclTensor *)dv}) {
            if (dim(tensor, 2) != dim(query, 2)) {
                return Reject(161002, "fake: dim 2 differs from query's");
            }
        }
    } else {
        for (const aclTensor *tensor : {key, value, attentionOut, dout, softmaxLse, (const aclTensor *)dq,
                                        (const aclTensor *)dk, (const aclTensor *)dv}) {
            if (dim(tensor, 0) != dim(query, 0)) {
                return Reject(161002, "fake: dim 0 differs from query's");
            }
        }
        const std::pair<const aclTensor *, const aclTensor *> pairs[] = {
            {query, key}, {value, attentionOut}, {value, dout}, {query, dq}, {key, dk}, {value, dv}};
        for (const auto &pair : pairs) {
            if (dim(pair.first, 3) != dim(pair.second, 3)) {
                return Reject(161002, "fake: dim 3 differs");
            }
        }
    }
    if (attenMaskOptional != nullptr) {
        return Reject(161002, "fake: attenMask must be null");
    }
    if (maskType != 0) {
        return Reject(161002, "fake: maskType must be 0");
    }
    if (preTokens != 2147483647 || nextTokens != 2147483647) {
        return Reject(161002, "fake: preTokens/nextTokens must be 2147483647");
    }
    if ((qLayout == "TND" && !actualSeqLengthsOptional) || (kvLayout == "TND" && !actualSeqLengthsKvOptional)) {
        return Reject(161002, "fake: TND needs actual sequence lengths");
    }
    if ((qLayout == "BNSD") != (kvLayout == "BNSD")) {
        return Reject(161002, "fake: layouts must both be BNSD or both not");
    }
    if (blockShapeOptional == nullptr) {
        return Reject(161001, "fake: blockShape is null");
    }
    if (blockShapeOptional->values.size() < 2 || blockShapeOptional->values[0] <= 0 ||
        blockShapeOptional->values[1] <= 0) {
        return Reject(161002, "fake: blockShape must hold two positive values");
    }
    if (qLayout != "TND" && qLayout != "BNSD") {
        return Reject(561002, "fake tiling: unsupported layout");
    }
    const size_t rank = qLayout == "TND" ? 3 : 4;
    if (query->dims.size() != rank || key->dims.size() != rank ||
        (qLayout == "BNSD" && blockSparseMaskOptional->dims.size() != 4)) {
        return Reject(561002, "fake tiling: query, key (or the BNSD mask) of the wrong rank");
    }
    if (qLayout == "BNSD" && (dim(query, 0) == 0 || dim(query, 2) == 0)) {
        return Reject(561002, "fake tiling: blockDim is 0 (B == 0 or Sq == 0)");
    }
    const int64_t n1 = dim(query, 1), n2 = dim(key, 1);
    if (n2 <= 0 || n1 < n2 || n1 % n2 != 0) {
        return Reject(561002, "fake tiling: N1 % N2 != 0 or N1 < N2");
    }
    if (qLayout == "TND") {
        int64_t tokens = 0;
        for (int64_t length : actualSeqLengthsOptional->values) {
            tokens += length;
        }
        if (tokens == 0) {
            return Reject(561002, "fake tiling: blockDim is 0 (no query token)");
        }
    }
    // What a run received, for the tests: the lengths (BNSD without lengths must still get [S] * B).
    std::printf("fake op: actualSeqLengths %s actualSeqLengthsKv %s\n", Join(actualSeqLengthsOptional).c_str(),
                Join(actualSeqLengthsKvOptional).c_str());
    std::printf("fake op: scaleValue %.17g\n", scaleValue);  // a chain's backward_scale reaches it
    if (ShouldFail("aclnnBlockSparseAttentionGradGetWorkspaceSize")) {
        return Reject(161002, "fake: forced failure");
    }
    *workspaceSize = 4096;
    *executor = new aclOpExecutor{{query, key, value}, {dq, dk, dv}, 4096};
    ++counters.executors;
    return 0;
}

aclnnStatus aclnnBlockSparseAttentionGrad(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                          const aclrtStream stream)
{
    if (executor == nullptr || stream == nullptr) {
        return Reject(161001, "fake: null executor or stream");
    }
    const aclOpExecutor run = *executor;
    delete executor;  // aclnn releases the executor after the second phase
    --counters.executors;
    if (workspace == nullptr || workspaceSize < run.workspaceSize) {
        return Reject(561103, "fake: workspace missing or too small");
    }
    if (const char *forced = std::getenv("FAKE_ACLNN_RUN_STATUS")) {
        return Reject(static_cast<aclnnStatus>(std::atoi(forced)), "fake: forced run status");
    }
    for (int i = 0; i < 3; ++i) {
        std::memcpy(run.outputs[i]->data, run.inputs[i]->data, Bytes(run.inputs[i]));
    }
    if (const char *past = std::getenv("FAKE_ACL_WRITE_PAST_END")) {
        const std::string text(past);
        const size_t colon = text.find(':');
        const std::string name = text.substr(0, colon);
        const long count = colon == std::string::npos ? 1 : std::atol(text.c_str() + colon + 1);
        const int index = name == "dq" ? 0 : name == "dk" ? 1 : name == "dv" ? 2 : -1;
        if (index >= 0) {
            aclTensor *out = run.outputs[index];
            const size_t element = out->dtype == ACL_FLOAT ? 4 : 2;  // dq, dk, dv are float16, bfloat16 or float32
            std::memset(static_cast<char *>(out->data) + Bytes(out), 0, static_cast<size_t>(count) * element);
        }
    }
    Launched();
    return 0;
}


// ---- the forward: aclnnBlockSparseAttention ---------------------------------------------------------------
//
// Its checks, in the order of ops-transformer master 5778144 (aclnn_block_sparse_attention.cpp ValidateParams
// and ValidateAdditionalParams, MakeContiguous, the infershape, then the A2/A3 tiling), written apart from
// bsa_cli/ops/forward_interface.py. Not every tiling rule is played: see tests/fake_acl/README.md. Then a CPU
// forward in float (dense softmax over the selected kv columns of each row), so a chain runs end to end:
// rows with no selected block and BNSD rows past the actual lengths are left alone, and so is lse with
// softmaxLseFlag 0.

namespace {

float HalfToFloat(uint16_t h)
{
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    int exponent = (h >> 10) & 0x1F;
    uint32_t mantissa = h & 0x3FF;
    uint32_t bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13);
    } else if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else {
            exponent = 1;
            while ((mantissa & 0x400) == 0) {
                mantissa <<= 1;
                --exponent;
            }
            mantissa &= 0x3FF;
            bits = sign | static_cast<uint32_t>(exponent + 112) << 23 | (mantissa << 13);
        }
    } else {
        bits = sign | static_cast<uint32_t>(exponent + 112) << 23 | (mantissa << 13);
    }
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
}

uint16_t FloatToHalf(float value)  // round to nearest, ties to even
{
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
    const uint32_t magnitude = bits & 0x7FFFFFFFu;
    if (magnitude > 0x7F800000u) {
        return sign | 0x7E00;
    }
    if (magnitude >= 0x477FF000u) {  // rounds to >= 65520: inf
        return sign | 0x7C00;
    }
    if (magnitude < 0x38800000u) {  // subnormal half (or zero)
        float absolute;
        std::memcpy(&absolute, &magnitude, 4);
        return sign | static_cast<uint16_t>(std::nearbyint(absolute * 16777216.0f));  // 2^24
    }
    const uint32_t rounded = magnitude + 0xFFF + ((magnitude >> 13) & 1);
    return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

float Load(const aclTensor *tensor, size_t index)
{
    uint16_t half;
    std::memcpy(&half, static_cast<const char *>(tensor->data) + 2 * index, 2);
    if (tensor->dtype == ACL_BF16) {
        const uint32_t bits = static_cast<uint32_t>(half) << 16;
        float value;
        std::memcpy(&value, &bits, 4);
        return value;
    }
    return HalfToFloat(half);
}

void Store(aclTensor *tensor, size_t index, float value)
{
    uint16_t half;
    if (tensor->dtype == ACL_BF16) {
        uint32_t bits;
        std::memcpy(&bits, &value, 4);
        half = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
    } else {
        half = FloatToHalf(value);
    }
    std::memcpy(static_cast<char *>(tensor->data) + 2 * index, &half, 2);
}

struct ForwardRun {
    const aclTensor *query, *key, *value, *mask;
    aclTensor *out, *lse;
    bool tnd;
    int64_t x, y;
    std::vector<int64_t> qLengths, kvLengths;
    float scale;
    int64_t softmaxLseFlag;
};

int64_t CeilDiv(int64_t n, int64_t d) { return n == 0 ? 0 : (n + d - 1) / d; }

}  // namespace

struct ForwardExecutor {
    ForwardRun run;
    uint64_t workspaceSize;
};

void DeleteForwardExecutor(ForwardExecutor *executor) { delete executor; }

aclnnStatus aclnnBlockSparseAttentionGetWorkspaceSize(
    const aclTensor *query, const aclTensor *key, const aclTensor *value, const aclTensor *blockSparseMaskOptional,
    const aclTensor *attenMaskOptional, const aclIntArray *blockShapeOptional,
    const aclIntArray *actualSeqLengthsOptional, const aclIntArray *actualSeqLengthsKvOptional,
    const aclTensor *blockTableOptional, char *qInputLayout, char *kvInputLayout, int64_t numKeyValueHeads,
    int64_t maskType, double scaleValue, int64_t innerPrecise, int64_t blockSize, int64_t preTokens,
    int64_t nextTokens, int64_t softmaxLseFlag, aclTensor *attentionOut, aclTensor *softmaxLseOptional,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    (void)maskType, (void)blockSize;
    // ValidateParams
    if (query == nullptr || key == nullptr || value == nullptr) {
        return Reject(161001, "fake forward: query, key or value is null");
    }
    if (query->dtype != ACL_FLOAT16 && query->dtype != ACL_BF16) {
        return Reject(161002, "fake forward: query dtype must be float16 or bfloat16");
    }
    if (key->dtype != query->dtype || value->dtype != query->dtype) {
        return Reject(161002, "fake forward: key/value dtype differs from query");
    }
    if (qInputLayout == nullptr || kvInputLayout == nullptr) {
        return Reject(161001, "fake forward: a layout string is null");
    }
    const std::string qLayout(qInputLayout), kvLayout(kvInputLayout);
    if (qLayout != "TND" && qLayout != "BNSD" && qLayout != "BSND") {
        return Reject(161002, "fake forward: qInputLayout must be TND, BNSD or BSND");
    }
    if (qLayout != kvLayout) {
        return Reject(161002, "fake forward: qInputLayout and kvInputLayout differ");
    }
    if (blockShapeOptional != nullptr &&
        (blockShapeOptional->values.size() != 2 || blockShapeOptional->values[0] <= 0 ||
         blockShapeOptional->values[1] <= 0)) {
        return Reject(161002, "fake forward: blockShape must hold two positive values");
    }
    // ValidateAdditionalParams, MakeContiguous
    if (innerPrecise != 0 && innerPrecise != 1 && innerPrecise != 4) {
        return Reject(161002, "fake forward: innerPrecise must be 0, 1 or 4");
    }
    if (attentionOut == nullptr) {
        return Reject(161001, "fake forward: attentionOut is null");
    }
    if (blockSparseMaskOptional != nullptr && blockSparseMaskOptional->dims.size() != 4) {
        return Reject(161002, "fake forward: blockSparseMask must be 4-D");
    }
    // infershape: 561103 (the l0op returns null outputs)
    const size_t rank = qLayout == "TND" ? 3 : 4;
    if (query->dims.size() != rank || key->dims.size() != rank || value->dims.size() != rank) {
        return Reject(561103, "fake forward infershape: query/key/value of the wrong rank for the layout");
    }
    const size_t nAxis = qLayout == "BSND" ? 2 : 1;
    if (numKeyValueHeads != 0 && key->dims[nAxis] != numKeyValueHeads) {
        return Reject(561103, "fake forward infershape: numKeyValueHeads differs from key's N");
    }
    const size_t dAxis = rank - 1;
    if ((qLayout != "TND" && value->dims[0] != key->dims[0]) || value->dims[dAxis] != key->dims[dAxis]) {
        return Reject(561103, "fake forward infershape: value's B or D differs from key's");
    }
    // A2/A3 tiling: 561002
    if (qLayout == "BSND") {
        return Reject(561002, "fake forward tiling: BSND is the 950's");
    }
    if (numKeyValueHeads == 0) {
        return Reject(561002, "fake forward tiling: numKeyValueHeads 0");
    }
    if (innerPrecise == 4 || (innerPrecise == 1 && query->dtype == ACL_BF16)) {
        return Reject(561002, "fake forward tiling: innerPrecise 4, or 1 with bfloat16");
    }
    if (preTokens != 2147483647 || nextTokens != 2147483647) {
        return Reject(561002, "fake forward tiling: preTokens/nextTokens must be 2147483647");
    }
    if (softmaxLseFlag != 0 && softmaxLseFlag != 1) {
        return Reject(561002, "fake forward tiling: softmaxLseFlag must be 0 or 1");
    }
    if (qLayout != "TND" && (query->dims[0] != key->dims[0] || key->dims[0] != value->dims[0])) {
        return Reject(561002, "fake forward tiling: B of query, key, value differ");
    }
    if (query->dims[dAxis] != key->dims[dAxis] || key->dims[dAxis] != value->dims[dAxis]) {
        return Reject(561002, "fake forward tiling: D of query, key, value differ");
    }
    if (key->dims[nAxis] != numKeyValueHeads || value->dims[nAxis] != numKeyValueHeads) {
        return Reject(561002, "fake forward tiling: key/value N differs from numKeyValueHeads");
    }
    if (query->dims[nAxis] % numKeyValueHeads != 0) {
        return Reject(561002, "fake forward tiling: N1 % numKeyValueHeads != 0");
    }
    const int64_t headDim = query->dims[rank - 1];
    if (headDim != 64 && headDim != 128) {
        return Reject(561002, "fake forward tiling: D must be 64 or 128");
    }
    const bool tnd = qLayout == "TND";
    const int64_t n1 = query->dims[1];
    std::vector<int64_t> qLengths, kvLengths;
    int64_t batch = 0, maxQ = 0, maxKv = 0;
    if (tnd) {
        if (actualSeqLengthsOptional == nullptr || actualSeqLengthsKvOptional == nullptr ||
            actualSeqLengthsOptional->values.size() != actualSeqLengthsKvOptional->values.size()) {
            return Reject(561002, "fake forward tiling: TND needs both lengths, of one size");
        }
        qLengths = actualSeqLengthsOptional->values;
        kvLengths = actualSeqLengthsKvOptional->values;
        batch = static_cast<int64_t>(qLengths.size());
        for (size_t b = 0; b < qLengths.size(); ++b) {
            maxQ = std::max(maxQ, qLengths[b]);
            maxKv = std::max(maxKv, kvLengths[b]);
        }
    } else {
        batch = query->dims[0];
        maxQ = query->dims[2];
        maxKv = key->dims[2];
        if ((actualSeqLengthsOptional == nullptr) != (actualSeqLengthsKvOptional == nullptr)) {
            return Reject(561002, "fake forward tiling: BNSD takes both lengths or neither");
        }
        qLengths.assign(static_cast<size_t>(batch), maxQ);
        kvLengths.assign(static_cast<size_t>(batch), maxKv);
        if (actualSeqLengthsOptional != nullptr) {
            qLengths = actualSeqLengthsOptional->values;
            kvLengths = actualSeqLengthsKvOptional->values;
            if (static_cast<int64_t>(qLengths.size()) != batch || static_cast<int64_t>(kvLengths.size()) != batch) {
                return Reject(561002, "fake forward tiling: one BNSD length per batch entry");
            }
            for (int64_t b = 0; b < batch; ++b) {
                if (qLengths[b] > maxQ || kvLengths[b] > maxKv) {
                    return Reject(561002, "fake forward tiling: a BNSD length exceeds S");
                }
            }
        }
    }
    if (blockSparseMaskOptional == nullptr) {
        return Reject(561002, "fake forward tiling: blockSparseMask is null");
    }
    const int64_t x = blockShapeOptional ? blockShapeOptional->values[0] : 128;
    const int64_t y = blockShapeOptional ? blockShapeOptional->values[1] : 128;
    if (y % 128 != 0) {
        return Reject(561002, "fake forward tiling: Y % 128 != 0");
    }
    const std::vector<int64_t> maskShape = {batch, n1, CeilDiv(maxQ, x), CeilDiv(maxKv, y)};
    if (blockSparseMaskOptional->dims != maskShape) {
        return Reject(561002, "fake forward tiling: blockSparseMask is not [B, N1, ceil(maxSq/X), ceil(maxSkv/Y)]");
    }
    if (attenMaskOptional != nullptr || blockTableOptional != nullptr) {
        return Reject(561002, "fake forward tiling: attenMask and blockTable must be null");
    }
    if (tnd) {
        int64_t qTokens = 0, kvTokens = 0;
        for (size_t b = 0; b < qLengths.size(); ++b) {
            qTokens += qLengths[b];
            kvTokens += kvLengths[b];
        }
        if (qTokens != query->dims[0] || kvTokens != key->dims[0]) {
            return Reject(561002, "fake forward tiling: TND lengths do not sum to T");
        }
    }
    int64_t rows = 0;
    for (int64_t length : qLengths) {
        rows += length;
    }
    if (batch == 0 || n1 == 0 || rows == 0) {
        return Reject(561002, "fake forward tiling: blockDim is 0 (no query row)");
    }
    if (softmaxLseFlag == 1 && softmaxLseOptional == nullptr) {
        return Reject(561103, "fake forward: softmaxLse is null with softmaxLseFlag 1 (its ViewCopy fails)");
    }
    if (ShouldFail("aclnnBlockSparseAttentionGetWorkspaceSize")) {
        return Reject(161002, "fake forward: forced failure");
    }
    std::printf("fake forward: actualSeqLengths %s actualSeqLengthsKv %s\n", Join(actualSeqLengthsOptional).c_str(),
                Join(actualSeqLengthsKvOptional).c_str());
    std::printf("fake forward: scaleValue %.17g\n", scaleValue);  // a chain's forward_scale reaches it
    *workspaceSize = 4096;
    auto *run = new ForwardExecutor{
        {query, key, value, blockSparseMaskOptional, attentionOut, softmaxLseOptional, tnd, x, y, qLengths,
         kvLengths, innerPrecise == 1 ? HalfToFloat(FloatToHalf(static_cast<float>(scaleValue)))
                                      : static_cast<float>(scaleValue),
         softmaxLseFlag},
        4096};
    *executor = reinterpret_cast<aclOpExecutor *>(run);
    ++counters.executors;
    forwardExecutors.push_back(run);
    return 0;
}

aclnnStatus aclnnBlockSparseAttention(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                      aclrtStream stream)
{
    auto *found = reinterpret_cast<ForwardExecutor *>(executor);
    auto it = std::find(forwardExecutors.begin(), forwardExecutors.end(), found);
    if (found == nullptr || it == forwardExecutors.end() || stream == nullptr) {
        return Reject(161001, "fake forward: null or unknown executor, or null stream");
    }
    forwardExecutors.erase(it);
    const ForwardRun run = found->run;
    const uint64_t needed = found->workspaceSize;
    delete found;  // aclnn releases the executor after the second phase
    --counters.executors;
    if (workspace == nullptr || workspaceSize < needed) {
        return Reject(561103, "fake forward: workspace missing or too small");
    }
    if (const char *forced = std::getenv("FAKE_ACLNN_RUN_STATUS")) {
        return Reject(static_cast<aclnnStatus>(std::atoi(forced)), "fake: forced run status");
    }
    const int64_t n1 = run.query->dims[1], n2 = run.key->dims[1];
    const int64_t d = run.query->dims.back();
    const int64_t sq = run.tnd ? 0 : run.query->dims[2], skv = run.tnd ? 0 : run.key->dims[2];
    const auto &mask = run.mask->dims;
    const auto *maskData = static_cast<const int8_t *>(run.mask->data);
    int64_t qStart = 0, kvStart = 0;
    for (size_t b = 0; b < run.qLengths.size(); ++b) {
        const int64_t qLen = run.qLengths[b], kvLen = run.kvLengths[b];
        for (int64_t n = 0; n < n1; ++n) {
            const int64_t kvHead = n / (n1 / n2);
            for (int64_t s = 0; s < qLen; ++s) {
                const size_t qRow = run.tnd ? static_cast<size_t>(((qStart + s) * n1 + n) * d)
                                            : static_cast<size_t>((((int64_t)b * n1 + n) * sq + s) * d);
                std::vector<int64_t> columns;
                for (int64_t j = 0; j < kvLen; ++j) {
                    const int64_t at = (((int64_t)b * mask[1] + n) * mask[2] + s / run.x) * mask[3] + j / run.y;
                    if (maskData[at] != 0) {
                        columns.push_back(j);
                    }
                }
                if (columns.empty()) {
                    continue;  // not written: out and lse keep what the buffer held
                }
                std::vector<float> scores(columns.size());
                float rowMax = -INFINITY;
                for (size_t c = 0; c < columns.size(); ++c) {
                    const size_t kRow = run.tnd ? static_cast<size_t>(((kvStart + columns[c]) * n2 + kvHead) * d)
                                                : static_cast<size_t>((((int64_t)b * n2 + kvHead) * skv + columns[c]) * d);
                    float dot = 0.0f;
                    for (int64_t e = 0; e < d; ++e) {
                        dot += Load(run.query, qRow + e) * Load(run.key, kRow + e);
                    }
                    scores[c] = dot * run.scale;
                    rowMax = std::max(rowMax, scores[c]);
                }
                float rowSum = 0.0f;
                std::vector<float> acc(static_cast<size_t>(d), 0.0f);
                for (size_t c = 0; c < columns.size(); ++c) {
                    const float p = std::exp(scores[c] - rowMax);
                    rowSum += p;
                    const size_t vRow = run.tnd ? static_cast<size_t>(((kvStart + columns[c]) * n2 + kvHead) * d)
                                                : static_cast<size_t>((((int64_t)b * n2 + kvHead) * skv + columns[c]) * d);
                    for (int64_t e = 0; e < d; ++e) {
                        acc[e] += p * Load(run.value, vRow + e);
                    }
                }
                for (int64_t e = 0; e < d; ++e) {
                    Store(run.out, qRow + e, acc[e] / rowSum);
                }
                if (run.softmaxLseFlag == 1) {
                    const float lse = std::log(rowSum) + rowMax;
                    std::memcpy(static_cast<char *>(run.lse->data) + 4 * (qRow / d), &lse, 4);
                }
            }
        }
        qStart += qLen;
        kvStart += kvLen;
    }
    Launched();
    return 0;
}

}  // extern "C"
