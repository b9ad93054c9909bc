// FAKE host-memory implementation of the declarations in tests/fake_acl/, for testing bsa's harness in CI.
// NOT CANN and not the operator: "device" memory is host memory, and the toy operator copies
// query/key/value into dq/dk/dv after a few interface checks (161001 for null inputs or missing TND
// lengths, 161002 for bad layouts or dtypes). It counts every acl resource and prints, at exit,
//     fake_acl report: init=0 device=0 streams=0 buffers=0 tensors=0 int_arrays=0 executors=0
// (the live count of each), so a test can check the harness frees everything on every path.
// FAKE_ACL_FAIL=<function>:<n> makes the n-th call of that function fail (error 507899, or nullptr).
// FAKE_ACLNN_RUN_STATUS=<code> makes aclnnBlockSparseAttentionGrad return that status.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnn_block_sparse_attention_grad.h"

struct aclTensor {
    std::vector<int64_t> dims;
    aclDataType dtype;
    void *data;
};
struct aclIntArray {
    std::vector<int64_t> values;
};
struct aclOpExecutor {
    const aclTensor *inputs[3];
    aclTensor *outputs[3];
    uint64_t workspaceSize;
};

namespace {

constexpr aclError kFakeError = 507899;

struct Counters {
    long init = 0, device = 0, streams = 0, buffers = 0, tensors = 0, intArrays = 0, executors = 0;
    std::map<std::string, long> calls;
    ~Counters()
    {
        std::fprintf(stderr,
                     "fake_acl report: init=%ld device=%ld streams=%ld buffers=%ld tensors=%ld int_arrays=%ld "
                     "executors=%ld\n",
                     init, device, streams, buffers, tensors, intArrays, executors);
    }
};
Counters counters;
std::string recentError;

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

aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor)
{
    if (executor == nullptr) {
        return 561103;
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
    (void)numKeyValueHeads, (void)scaleValue;
    // The checks of ops-transformer master (5778144) in their order: a null layout first (d42799fe6),
    // ValidateParams (op_host/op_api/aclnn_block_sparse_attention_grad.cpp), then the A2/A3 tiling (561002).
    // Written apart from bsa_cli/interface.py on purpose: running the negative suite through the harness and
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
    return 0;
}

}  // extern "C"
