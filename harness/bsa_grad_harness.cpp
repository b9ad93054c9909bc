// bsa_grad_harness: run aclnnBlockSparseAttentionGrad on one case written by `bsa gen`.
//
// The bsa binary contract (docs/run.md):
//
//     bsa_grad_harness [options] <case_dir>/case.json <output_dir>
//
// reads <case_dir>/case.txt (the flat `key value...` file of the case) and the input .bin files it lists,
// builds the aclTensors in the case's layout and dtype, calls aclnnBlockSparseAttentionGradGetWorkspaceSize
// and aclnnBlockSparseAttentionGrad on device ASCEND_DEVICE_ID, and writes into <output_dir>:
//   dq.bin dk.bin dv.bin   raw little-endian, as the case's `output` lines say (only when the status is 0)
//   status.txt             first line the aclnn status (0, 161001, 161002, ...), second line a message
//
// A case folder whose case.txt says `op forward` runs aclnnBlockSparseAttention (out.bin, lse.bin; the mask
// as int8; out and lse pre-filled with NaN), `op chain` the forward and then the backward on the forward's
// own device outputs (all five files); `op autograd` is torch_npu's (exit 5). See README.md.
//
// Exit codes: 0 the status was recorded (whatever it is); 2 bad arguments or case files;
// 3 an AscendCL runtime call failed (init, device, memory, stream sync); 4 an output file could not be
// written; 5 this op cannot run here (stderr: "cannot run: <why>"). Every acl resource is released on
// every path (RAII).
//
// Options:
//   --device N              device id (default: $ASCEND_DEVICE_ID, else 0)
//   --fill nan|zero|none    fill dq/dk/dv on the device before the call (default nan: bytes 0xFF, so an
//                           element the kernel never writes shows up as NaN instead of passing as 0)
//   --mask-dtype uint8|bool dtype of the blockSparseMask tensor (default: the case's, uint8 unless a case
//                           says bool or, for a negative case, int8; same bytes either way)

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <climits>
#include <libgen.h>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnn_block_sparse_attention_grad.h"
#ifndef BSA_NO_FORWARD
#include "aclnn_block_sparse_attention.h"
#endif

namespace {

constexpr int kExitOk = 0;
constexpr int kExitBadInput = 2;
constexpr int kExitRuntime = 3;
constexpr int kExitWrite = 4;
constexpr int kExitCannotRun = 5;  // this op cannot run here (autograd); stderr: "cannot run: <why>"

// An error that ends the run with an exit code (after every RAII owner has released its resource).
class HarnessError : public std::runtime_error {
public:
    HarnessError(int exitCode, const std::string &message) : std::runtime_error(message), exitCode_(exitCode) {}
    int exitCode() const { return exitCode_; }

private:
    int exitCode_;
};

// An op this harness cannot run (autograd is torch_npu's; the forward when built without its header):
// exit kExitCannotRun, first stderr line "cannot run: <why>", which bsa run records as a skipped case.
class CannotRun : public std::runtime_error {
public:
    explicit CannotRun(const std::string &why) : std::runtime_error(why) {}
};

std::string RecentAclMessage()
{
    const char *message = aclGetRecentErrMsg();
    return message != nullptr ? std::string(message) : std::string();
}

void CheckAcl(aclError ret, const char *what)
{
    if (ret != ACL_SUCCESS) {
        std::ostringstream text;
        text << what << " failed with error " << ret;
        const std::string detail = RecentAclMessage();
        if (!detail.empty()) {
            text << ": " << detail;
        }
        throw HarnessError(kExitRuntime, text.str());
    }
}

// ---- the case ------------------------------------------------------------------------------------------

struct ArraySpec {
    std::string name;
    std::string file;
    std::string dtype;
    std::vector<int64_t> dims;
};

struct CaseSpec {
    std::map<std::string, std::string> params;  // key -> rest of the line
    std::map<std::string, ArraySpec> inputs;
    std::map<std::string, ArraySpec> outputs;

    const std::string &Param(const std::string &key) const
    {
        auto it = params.find(key);
        if (it == params.end()) {
            throw HarnessError(kExitBadInput, "case.txt has no '" + key + "' line");
        }
        return it->second;
    }

    int64_t IntParam(const std::string &key) const
    {
        const std::string &text = Param(key);
        char *end = nullptr;
        errno = 0;
        const long long value = std::strtoll(text.c_str(), &end, 10);
        if (errno != 0 || end == text.c_str() || *end != '\0') {
            throw HarnessError(kExitBadInput, "case.txt: '" + key + "' is not an integer: " + text);
        }
        return static_cast<int64_t>(value);
    }

    int64_t IntParamOr(const std::string &key, int64_t fallback) const
    {
        return params.count(key) ? IntParam(key) : fallback;
    }

    double DoubleParam(const std::string &key) const
    {
        const std::string &text = Param(key);
        char *end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0') {
            throw HarnessError(kExitBadInput, "case.txt: '" + key + "' is not a number: " + text);
        }
        return value;
    }

    // A chain step's own scaleValue (`forward_scale`, `backward_scale`: the case's step_scales), else `scale`.
    double DoubleParamOr(const std::string &key, double fallback) const
    {
        return params.count(key) ? DoubleParam(key) : fallback;
    }

    // A list parameter: nullptr-equivalent (false) when written as "-".
    bool ListParam(const std::string &key, std::vector<int64_t> *values) const
    {
        const std::string &text = Param(key);
        values->clear();
        if (text == "-") {
            return false;
        }
        std::istringstream in(text);
        std::string token;
        while (in >> token) {
            char *end = nullptr;
            const long long value = std::strtoll(token.c_str(), &end, 10);
            if (end == token.c_str() || *end != '\0') {
                throw HarnessError(kExitBadInput, "case.txt: '" + key + "' has a non-integer: " + token);
            }
            values->push_back(static_cast<int64_t>(value));
        }
        return true;
    }
};

// A file of case.txt is a plain relative path that stays inside its folder: no absolute path, no '..',
// and no symbolic link on the way out (bsa checks case.json the same way; case.txt is derived from it,
// and bsa run rewrites it from case.json before each run, but the harness trusts neither).
void CheckRelative(const std::string &file, const std::string &line)
{
    if (file.empty() || file[0] == '/' || file[0] == '\\') {
        throw HarnessError(kExitBadInput, "case.txt: '" + file + "' is not a relative path inside its folder: " + line);
    }
    std::istringstream parts(file);
    std::string part;
    while (std::getline(parts, part, '/')) {
        if (part == "..") {
            throw HarnessError(kExitBadInput, "case.txt: '" + file + "' climbs out of its folder with '..': " + line);
        }
    }
}

std::string RealPath(const std::string &path)
{
    char resolved[PATH_MAX];
    if (realpath(path.c_str(), resolved) == nullptr) {
        throw HarnessError(kExitBadInput, "cannot resolve " + path + ": " + std::strerror(errno));
    }
    return resolved;
}

// base + "/" + file, after checking that it (for an output: the folder that will hold it) lies inside
// base once symbolic links are followed.
std::string Inside(const std::string &base, const std::string &file, bool exists)
{
    const std::string path = base + "/" + file;
    std::string probe = path;
    if (exists && !std::ifstream(path)) {
        return path;  // missing: the reader says so
    }
    if (!exists) {
        std::vector<char> copy(path.begin(), path.end());
        copy.push_back('\0');
        probe = dirname(copy.data());
    }
    const std::string root = RealPath(base);
    const std::string real = RealPath(probe);
    if (real != root && real.compare(0, root.size() + 1, root + "/") != 0) {
        throw HarnessError(kExitBadInput, path + " leads out of " + base + " through a symbolic link");
    }
    if (exists && real == root) {
        throw HarnessError(kExitBadInput, path + " names the folder itself, not a file in it");
    }
    return path;
}

ArraySpec ParseArrayLine(std::istringstream &in, const std::string &line)
{
    ArraySpec spec;
    size_t ndim = 0;
    if (!(in >> spec.name >> spec.file >> spec.dtype >> ndim)) {
        throw HarnessError(kExitBadInput, "case.txt: malformed array line: " + line);
    }
    CheckRelative(spec.file, line);
    for (size_t i = 0; i < ndim; ++i) {
        int64_t dim = 0;
        if (!(in >> dim) || dim < 0) {
            throw HarnessError(kExitBadInput, "case.txt: bad dimension in: " + line);
        }
        spec.dims.push_back(dim);
    }
    return spec;
}

CaseSpec ReadCase(const std::string &path)
{
    std::ifstream file(path);
    if (!file) {
        throw HarnessError(kExitBadInput, "cannot read " + path + " (write the case with `bsa gen`)");
    }
    CaseSpec spec;
    std::string line;
    while (std::getline(file, line)) {
        if (line.empty()) {
            continue;
        }
        std::istringstream in(line);
        std::string key;
        in >> key;
        if (key == "input" || key == "output") {
            ArraySpec array = ParseArrayLine(in, line);
            (key == "input" ? spec.inputs : spec.outputs)[array.name] = array;
        } else if (key == "golden") {
            continue;  // the harness never reads the golden
        } else {
            std::string rest;
            std::getline(in >> std::ws, rest);
            spec.params[key] = rest;
        }
    }
    if (spec.Param("format") != "bsa-case/1") {
        throw HarnessError(kExitBadInput, path + ": format '" + spec.Param("format") + "' is not bsa-case/1");
    }
    return spec;
}

struct DtypeInfo {
    aclDataType acl;
    size_t size;
};

DtypeInfo Dtype(const std::string &name)
{
    static const std::map<std::string, DtypeInfo> table = {
        {"float16", {ACL_FLOAT16, 2}}, {"bfloat16", {ACL_BF16, 2}}, {"float32", {ACL_FLOAT, 4}},
        {"float64", {ACL_DOUBLE, 8}},  {"uint8", {ACL_UINT8, 1}},   {"bool", {ACL_BOOL, 1}},
        {"int64", {ACL_INT64, 8}},    {"int8", {ACL_INT8, 1}},     {"int32", {ACL_INT32, 4}},
    };
    auto it = table.find(name);
    if (it == table.end()) {
        throw HarnessError(kExitBadInput, "case.txt: unknown dtype '" + name + "'");
    }
    return it->second;
}

size_t ElementCount(const std::vector<int64_t> &dims)
{
    size_t count = 1;
    for (int64_t dim : dims) {
        count *= static_cast<size_t>(dim);
    }
    return count;
}

std::vector<char> ReadFile(const std::string &path, size_t expected)
{
    std::ifstream file(path, std::ios::binary | std::ios::ate);
    if (!file) {
        throw HarnessError(kExitBadInput, "cannot read " + path);
    }
    const std::streamoff size = file.tellg();
    if (size < 0 || static_cast<size_t>(size) != expected) {
        throw HarnessError(kExitBadInput, path + ": " + std::to_string(static_cast<long long>(size)) +
                                              " bytes, expected " + std::to_string(expected));
    }
    std::vector<char> data(expected);
    file.seekg(0);
    if (expected > 0 && !file.read(data.data(), static_cast<std::streamsize>(expected))) {
        throw HarnessError(kExitBadInput, "cannot read " + path);
    }
    return data;
}

void WriteFile(const std::string &path, const void *data, size_t size)
{
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    if (!file || !file.write(static_cast<const char *>(data), static_cast<std::streamsize>(size)) || !file.flush()) {
        throw HarnessError(kExitWrite, "cannot write " + path);
    }
}

void WriteStatus(const std::string &outputDir, aclnnStatus status, const std::string &message)
{
    std::string text = std::to_string(status) + "\n";
    if (!message.empty()) {
        std::string oneLine = message;
        for (char &c : oneLine) {
            if (c == '\n' || c == '\r') {
                c = ' ';
            }
        }
        text += oneLine + "\n";
    }
    WriteFile(outputDir + "/status.txt", text.data(), text.size());
}

// ---- RAII owners of acl resources --------------------------------------------------------------------

class AclSession {
public:
    AclSession(int32_t deviceId, bool deterministic) : deviceId_(deviceId)
    {
        CheckAcl(aclInit(nullptr), "aclInit");
        initialized_ = true;
        try {
            CheckAcl(aclrtSetDevice(deviceId_), "aclrtSetDevice");
            deviceSet_ = true;
            if (deterministic) {
                // aclError aclrtCtxSetSysParamOpt(aclSysParamOpt opt, int64_t value) (acl/acl_rt.h, CANN 8.0+):
                // the context-scoped switch the operator's tiling reads through GetDeterministic().
                CheckAcl(aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC, 1), "aclrtCtxSetSysParamOpt");
                std::cout << "deterministic mode: aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC, 1)" << std::endl;
            }
            CheckAcl(aclrtCreateStream(&stream_), "aclrtCreateStream");
        } catch (...) {
            Release();
            throw;
        }
    }
    ~AclSession() { Release(); }
    AclSession(const AclSession &) = delete;
    AclSession &operator=(const AclSession &) = delete;

    aclrtStream stream() const { return stream_; }

private:
    void Release()
    {
        if (stream_ != nullptr) {
            aclrtDestroyStream(stream_);
            stream_ = nullptr;
        }
        if (deviceSet_) {
            aclrtResetDevice(deviceId_);
            deviceSet_ = false;
        }
        if (initialized_) {
            aclFinalize();
            initialized_ = false;
        }
    }

    int32_t deviceId_;
    aclrtStream stream_ = nullptr;
    bool initialized_ = false;
    bool deviceSet_ = false;
};

class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t size) : size_(size)
    {
        if (size_ > 0) {
            CheckAcl(aclrtMalloc(&ptr_, size_, ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc");
        }
    }
    ~DeviceBuffer()
    {
        if (ptr_ != nullptr) {
            aclrtFree(ptr_);
        }
    }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;
    DeviceBuffer(DeviceBuffer &&other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)), size_(other.size_) {}
    DeviceBuffer &operator=(DeviceBuffer &&other) noexcept
    {
        std::swap(ptr_, other.ptr_);
        std::swap(size_, other.size_);
        return *this;
    }

    void *get() const { return ptr_; }
    size_t size() const { return size_; }

private:
    void *ptr_ = nullptr;
    size_t size_ = 0;
};

struct TensorDeleter {
    void operator()(aclTensor *tensor) const { aclDestroyTensor(tensor); }
};
struct IntArrayDeleter {
    void operator()(aclIntArray *array) const { aclDestroyIntArray(array); }
};
using TensorPtr = std::unique_ptr<aclTensor, TensorDeleter>;
using IntArrayPtr = std::unique_ptr<aclIntArray, IntArrayDeleter>;

// A device tensor: its buffer, its contiguous ND aclTensor, and what it holds.
// Bytes of the guard zone before and after each output (cuDNN frontend's tests surround buffers the same way):
// filled with kGuardByte, they must read back unchanged after the call, or the kernel wrote outside the tensor.
// 64 KiB covers a whole 128x128 fp32 tile written one block too far, and keeps the tensor 512-byte aligned.
constexpr size_t kGuardBytes = 64 << 10;
constexpr unsigned char kGuardByte = 0xFF;  // NaN in float16, bfloat16 and float32: no result looks like it

// A device tensor: its buffer, its contiguous ND aclTensor, and what it holds. A guarded one (an output) lies
// kGuardBytes into its buffer, with kGuardBytes of guard zone after it.
struct DeviceTensor {
    ArraySpec spec;
    DtypeInfo dtype{ACL_DT_UNDEFINED, 0};
    DeviceBuffer buffer;
    TensorPtr tensor;
    size_t guard = 0;

    size_t bytes() const { return ElementCount(spec.dims) * dtype.size; }
    void *data() const { return buffer.get() == nullptr ? nullptr : static_cast<char *>(buffer.get()) + guard; }
};

std::unique_ptr<DeviceTensor> MakeTensor(const ArraySpec &spec, const std::string &dtypeOverride = "",
                                         bool guarded = false)
{
    auto result = std::make_unique<DeviceTensor>();
    result->spec = spec;
    result->dtype = Dtype(dtypeOverride.empty() ? spec.dtype : dtypeOverride);
    result->guard = guarded ? kGuardBytes : 0;
    result->buffer = DeviceBuffer(result->bytes() + 2 * result->guard);
    if (guarded) {
        CheckAcl(aclrtMemset(result->buffer.get(), result->buffer.size(), kGuardByte, result->buffer.size()),
                 "aclrtMemset (guard zones)");
    }
    const std::vector<int64_t> &dims = spec.dims;
    std::vector<int64_t> strides(dims.size(), 1);
    for (size_t i = dims.size(); i-- > 1;) {
        strides[i - 1] = strides[i] * dims[i];
    }
    aclTensor *tensor = aclCreateTensor(dims.data(), dims.size(), result->dtype.acl, strides.data(), 0, ACL_FORMAT_ND,
                                        dims.data(), dims.size(), result->data());
    if (tensor == nullptr) {
        throw HarnessError(kExitRuntime, "aclCreateTensor failed for " + spec.name + ": " + RecentAclMessage());
    }
    result->tensor.reset(tensor);
    return result;
}

// The executor of the first phase: the second phase releases it; if that never runs (the workspace
// allocation failed), it is destroyed here, as the ops' own test framework does after a failed tiling.
// Toolkits without aclDestroyAclOpExecutor: build with -DBSA_NO_EXECUTOR_DESTROY (leaks it on that path).
class ExecutorGuard {
public:
    ExecutorGuard() = default;
    ~ExecutorGuard()
    {
#ifndef BSA_NO_EXECUTOR_DESTROY
        if (executor_ != nullptr) {
            aclDestroyAclOpExecutor(executor_);
        }
#endif
    }
    ExecutorGuard(const ExecutorGuard &) = delete;
    ExecutorGuard &operator=(const ExecutorGuard &) = delete;

    aclOpExecutor **out() { return &executor_; }
    // Hand the executor to the second phase, which releases it.
    aclOpExecutor *release() { return std::exchange(executor_, nullptr); }

private:
    aclOpExecutor *executor_ = nullptr;
};

IntArrayPtr MakeIntArray(const std::vector<int64_t> &values, const char *what)
{
    aclIntArray *array = aclCreateIntArray(values.data(), values.size());
    if (array == nullptr) {
        throw HarnessError(kExitRuntime, std::string("aclCreateIntArray failed for ") + what);
    }
    return IntArrayPtr(array);
}

// ---- the run -----------------------------------------------------------------------------------------

struct Options {
    std::string manifest;
    std::string outputDir;
    int32_t deviceId = 0;
    bool deterministic = false;  // --deterministic, or BSA_DETERMINISTIC=1 (what `bsa run --deterministic` sets)
    std::string fill = "nan";
    std::string maskDtype;  // empty: the dtype of the case's block_sparse_mask input line
    int timeRuns = 0;       // --time-runs N or BSA_TIME_RUNS: timed calls after the judged one (0: not timed)
    int timeWarmup = 0;     // --warmup N or BSA_TIME_WARMUP: untimed calls before the timed ones
};

const char *kUsage =
    "usage: bsa_grad_harness [--device N] [--deterministic] [--fill nan|zero|none] [--mask-dtype uint8|bool] "
    "[--time-runs N] [--warmup N] <case_dir>/case.json <output_dir>\n";

// A count of calls: a non-negative integer of at most 100000.
int CallCount(const std::string &text, const char *what)
{
    char *end = nullptr;
    errno = 0;
    const long value = std::strtol(text.c_str(), &end, 10);
    if (errno != 0 || end == text.c_str() || *end != '\0' || value < 0 || value > 100000) {
        throw HarnessError(kExitBadInput, std::string(what) + " must be a whole number from 0 to 100000, not '" + text + "'");
    }
    return static_cast<int>(value);
}

Options ParseArgs(int argc, char **argv)
{
    Options options;
    if (const char *env = std::getenv("ASCEND_DEVICE_ID")) {
        options.deviceId = static_cast<int32_t>(std::atoi(env));
    }
    if (const char *env = std::getenv("BSA_DETERMINISTIC")) {
        options.deterministic = std::string(env) == "1";
    }
    if (const char *env = std::getenv("BSA_TIME_RUNS")) {
        options.timeRuns = CallCount(env, "BSA_TIME_RUNS");
    }
    if (const char *env = std::getenv("BSA_TIME_WARMUP")) {
        options.timeWarmup = CallCount(env, "BSA_TIME_WARMUP");
    }
    std::vector<std::string> positional;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&](const char *flag) -> std::string {
            if (i + 1 >= argc) {
                throw HarnessError(kExitBadInput, std::string(flag) + " needs a value\n" + kUsage);
            }
            return argv[++i];
        };
        if (arg == "--device") {
            options.deviceId = static_cast<int32_t>(std::atoi(value("--device").c_str()));
        } else if (arg == "--deterministic") {
            options.deterministic = true;
        } else if (arg == "--fill") {
            options.fill = value("--fill");
            if (options.fill != "nan" && options.fill != "zero" && options.fill != "none") {
                throw HarnessError(kExitBadInput, "--fill must be nan, zero or none");
            }
        } else if (arg == "--mask-dtype") {
            options.maskDtype = value("--mask-dtype");
            if (options.maskDtype != "uint8" && options.maskDtype != "bool") {
                throw HarnessError(kExitBadInput, "--mask-dtype must be uint8 or bool");
            }
        } else if (arg == "--time-runs") {
            options.timeRuns = CallCount(value("--time-runs"), "--time-runs");
        } else if (arg == "--warmup") {
            options.timeWarmup = CallCount(value("--warmup"), "--warmup");
        } else if (arg == "-h" || arg == "--help") {
            std::cout << kUsage;
            std::exit(kExitOk);
        } else if (!arg.empty() && arg[0] == '-') {
            throw HarnessError(kExitBadInput, "unknown option " + arg + "\n" + kUsage);
        } else {
            positional.push_back(arg);
        }
    }
    if (positional.size() != 2) {
        throw HarnessError(kExitBadInput, kUsage);
    }
    options.manifest = positional[0];
    options.outputDir = positional[1];
    return options;
}

std::string CaseDir(const std::string &manifest)
{
    const size_t slash = manifest.find_last_of('/');
    if (manifest.size() >= 9 && manifest.compare(manifest.size() - 9, 9, "case.json") == 0) {
        return slash == std::string::npos ? "." : manifest.substr(0, slash);
    }
    return manifest;  // a case directory was given
}

std::vector<char> LayoutBuffer(const std::string &layout)
{
    std::vector<char> buffer(layout.begin(), layout.end());
    buffer.push_back('\0');
    return buffer;
}

// ---- guard zones and timing ------------------------------------------------------------------------------

long long FloorDiv(long long value, long long by) { return value >= 0 ? value / by : -((-value + by - 1) / by); }

// Reads back both guard zones of a guarded output and prints, for each zone the call wrote into,
//     bsa-guard-write: NAME OFFSET COUNT
// OFFSET the first changed element counted from the tensor's first one (negative: before it; the tensor's
// size or more: after it), COUNT the elements from there to the last changed one in that zone.
void CheckGuards(const char *name, const DeviceTensor &tensor)
{
    if (tensor.guard == 0) {
        return;
    }
    std::vector<unsigned char> zone(tensor.guard);
    const long long element = static_cast<long long>(tensor.dtype.size);
    for (const bool before : {true, false}) {
        const size_t start = before ? 0 : tensor.guard + tensor.bytes();
        CheckAcl(aclrtMemcpy(zone.data(), zone.size(), static_cast<char *>(tensor.buffer.get()) + start, zone.size(),
                             ACL_MEMCPY_DEVICE_TO_HOST),
                 "aclrtMemcpy (guard zone)");
        long long first = -1, last = -1;
        for (size_t i = 0; i < zone.size(); ++i) {
            if (zone[i] != kGuardByte) {
                first = first < 0 ? static_cast<long long>(i) : first;
                last = static_cast<long long>(i);
            }
        }
        if (first < 0) {
            continue;
        }
        const long long origin = before ? -static_cast<long long>(tensor.guard) : static_cast<long long>(tensor.bytes());
        const long long firstElement = FloorDiv(origin + first, element);
        const long long lastElement = FloorDiv(origin + last, element);
        std::cout << "bsa-guard-write: " << name << " " << firstElement << " " << lastElement - firstElement + 1
                  << std::endl;
    }
}

// A device event that records a timestamp: ACL_EVENT_TIME_LINE (0x00000008U, acl_rt.h), which
// aclrtEventElapsedTime requires of both its events (CANN AscendCL API reference, aclrtCreateEventWithFlag).
class TimingEvent {
public:
    TimingEvent() { CheckAcl(aclrtCreateEventWithFlag(&event_, ACL_EVENT_TIME_LINE), "aclrtCreateEventWithFlag"); }
    ~TimingEvent() { aclrtDestroyEvent(event_); }
    TimingEvent(const TimingEvent &) = delete;
    TimingEvent &operator=(const TimingEvent &) = delete;
    aclrtEvent get() const { return event_; }

private:
    aclrtEvent event_ = nullptr;
};

// Times one operator step (docs/run.md, "Timed runs"): options.timeWarmup untimed calls, then
// options.timeRuns calls, each between two events recorded on the stream, printing for each timed call
//     bsa-time-us: STEP MICROSECONDS
// `call(startClock, stopClock)` makes one whole call: refilling its outputs, the first phase and the workspace
// before startClock(), only the second phase (the kernel launch) between the two; stopClock() waits for the
// end event, so the call may free its workspace after it.
template <typename Call>
void TimeStep(const Options &options, aclrtStream stream, const char *step, Call call)
{
    if (options.timeRuns <= 0) {
        return;
    }
    std::cout << "bsa-timing: " << step << " warmup " << options.timeWarmup << " runs " << options.timeRuns << std::endl;
    TimingEvent start, end;
    for (int i = 0; i < options.timeWarmup + options.timeRuns; ++i) {
        auto startClock = [&] { CheckAcl(aclrtRecordEvent(start.get(), stream), "aclrtRecordEvent"); };
        auto stopClock = [&] {
            CheckAcl(aclrtRecordEvent(end.get(), stream), "aclrtRecordEvent");
            CheckAcl(aclrtSynchronizeEvent(end.get()), "aclrtSynchronizeEvent");
        };
        call(startClock, stopClock);
        float ms = 0.0f;
        CheckAcl(aclrtEventElapsedTime(&ms, start.get(), end.get()), "aclrtEventElapsedTime");
        if (i >= options.timeWarmup) {
            std::cout << "bsa-time-us: " << step << " " << static_cast<double>(ms) * 1000.0 << std::endl;
        }
    }
}

// Fill an output before a call: bytes 0xFF (NaN) or zero, or nothing (--fill).
void FillOutput(const DeviceTensor &tensor, const std::string &fill)
{
    if (fill != "none" && tensor.bytes() > 0) {
        const int32_t byte = fill == "nan" ? 0xFF : 0;
        CheckAcl(aclrtMemset(tensor.data(), tensor.bytes(), byte, tensor.bytes()), "aclrtMemset");
    }
}

// A nonzero status of a timed call (the judged call of the same case returned 0): the device failed.
void CheckTimedStatus(aclnnStatus status, const char *what)
{
    if (status != 0) {
        throw HarnessError(kExitRuntime, std::string("timed call: ") + what + " returned " + std::to_string(status) +
                                             " after the judged call returned 0: " + RecentAclMessage());
    }
}

// ---- the forward and the chain -------------------------------------------------------------------------

#ifndef BSA_NO_FORWARD
// Host bytes of one input line, checked against its dtype and shape (a bad or stale file fails before the
// device is touched).
std::vector<char> ReadInput(const std::string &caseDir, const ArraySpec &array)
{
    return ReadFile(Inside(caseDir, array.file, true), ElementCount(array.dims) * Dtype(array.dtype).size);
}

// Fill a forward output buffer before the call, so a row the operator never writes shows: NaN of the
// tensor's dtype (float16 0x7E00, bfloat16 0x7FC0, float32 0x7FC00000), zero bytes, or nothing.
void Prefill(const DeviceTensor &tensor, const std::string &fill)
{
    if (fill == "none" || tensor.bytes() == 0) {
        return;
    }
    if (fill == "zero") {
        CheckAcl(aclrtMemset(tensor.data(), tensor.bytes(), 0, tensor.bytes()), "aclrtMemset");
        return;
    }
    std::vector<char> host(tensor.bytes());
    if (tensor.dtype.acl == ACL_FLOAT) {
        const uint32_t nan = 0x7FC00000u;
        for (size_t i = 0; i + 4 <= host.size(); i += 4) {
            std::memcpy(&host[i], &nan, 4);
        }
    } else if (tensor.dtype.acl == ACL_FLOAT16 || tensor.dtype.acl == ACL_BF16) {
        const uint16_t nan = tensor.dtype.acl == ACL_FLOAT16 ? 0x7E00 : 0x7FC0;
        for (size_t i = 0; i + 2 <= host.size(); i += 2) {
            std::memcpy(&host[i], &nan, 2);
        }
    } else {
        std::memset(host.data(), 0xFF, host.size());  // a negative case's other dtype: bytes 0xFF
    }
    CheckAcl(aclrtMemcpy(tensor.data(), tensor.bytes(), host.data(), host.size(),
                         ACL_MEMCPY_HOST_TO_DEVICE),
             "aclrtMemcpy (prefill)");
}

std::unique_ptr<DeviceTensor> Upload(const ArraySpec &spec, const std::vector<char> &data,
                                     const std::string &dtypeOverride = "")
{
    auto tensor = MakeTensor(spec, dtypeOverride);
    if (!data.empty()) {
        CheckAcl(aclrtMemcpy(tensor->data(), tensor->bytes(), data.data(), data.size(),
                             ACL_MEMCPY_HOST_TO_DEVICE),
                 "aclrtMemcpy (host to device)");
    }
    return tensor;
}

void Download(const DeviceTensor &tensor, const std::string &outputDir)
{
    std::vector<char> data(tensor.bytes());
    if (!data.empty()) {
        CheckAcl(aclrtMemcpy(data.data(), data.size(), tensor.data(), tensor.bytes(),
                             ACL_MEMCPY_DEVICE_TO_HOST),
                 "aclrtMemcpy (device to host)");
    }
    WriteFile(Inside(outputDir, tensor.spec.file, false), data.data(), data.size());
}

#endif  // BSA_NO_FORWARD

// forward: aclnnBlockSparseAttention on query, key, value and the mask (as int8, the dtype the forward
// registers: the same bytes), writing out and lse. chain: then aclnnBlockSparseAttentionGrad on the
// forward's own out and lse, still on the device, with the mask in the backward's dtype (the case's input
// line, or --mask-dtype), writing dq, dk, dv too. The status is the first nonzero one.
int RunForwardOp(const Options &options, const std::string &caseDir, const CaseSpec &spec, bool chain)
{
#ifdef BSA_NO_FORWARD
    (void)options, (void)caseDir, (void)spec, (void)chain;
    throw CannotRun("this harness was built without aclnn_block_sparse_attention.h (BSA_NO_FORWARD): rebuild it "
                    "against a toolkit with aclnnBlockSparseAttention");
#else
    // atten_mask and block_table are passed only when a (negative) case gives them; otherwise null.
    std::vector<const char *> names = {"query", "key", "value", "block_sparse_mask", "atten_mask", "block_table"};
    if (chain) {
        names.push_back("dout");
    }
    std::map<std::string, std::vector<char>> host;
    for (const char *name : names) {
        auto it = spec.inputs.find(name);
        if (it != spec.inputs.end()) {
            host[name] = ReadInput(caseDir, it->second);
        }
    }
    auto maskLine = spec.inputs.find("block_sparse_mask");
    if (maskLine != spec.inputs.end() && Dtype(maskLine->second.dtype).size != 1) {
        throw HarnessError(kExitBadInput, "case.txt: block_sparse_mask is " + maskLine->second.dtype +
                                              ": the forward takes its bytes as int8, so it must be a 1-byte dtype");
    }
    std::vector<const char *> outputNames = {"out", "lse"};
    if (chain) {
        for (const char *name : {"dq", "dk", "dv"}) {
            outputNames.push_back(name);
        }
    }
    // An output the case leaves out is passed as nullptr (a negative case: attentionOut null is 161001);
    // every output is checked before any is written.
    for (const char *name : outputNames) {
        if (spec.outputs.count(name)) {
            Inside(options.outputDir, spec.outputs.at(name).file, false);
        }
    }

    AclSession session(options.deviceId, options.deterministic);

    std::map<std::string, std::unique_ptr<DeviceTensor>> inputs;
    for (const char *name : names) {
        auto it = spec.inputs.find(name);
        if (it == spec.inputs.end()) {
            continue;
        }
        const bool isMask = std::string(name) == "block_sparse_mask";
        inputs[name] = Upload(it->second, host[name], isMask ? "int8" : "");
    }
    auto input = [&](const char *name) -> const aclTensor * {
        auto it = inputs.find(name);
        return it == inputs.end() ? nullptr : it->second->tensor.get();
    };
    std::map<std::string, std::unique_ptr<DeviceTensor>> outputs;
    for (const char *name : outputNames) {
        auto it = spec.outputs.find(name);
        if (it == spec.outputs.end()) {
            continue;
        }
        auto tensor = MakeTensor(it->second, "", true);  // guarded: a write outside it shows
        const bool forwardOutput = std::string(name) == "out" || std::string(name) == "lse";
        if (forwardOutput) {
            Prefill(*tensor, options.fill);
        } else {
            FillOutput(*tensor, options.fill);
        }
        outputs[name] = std::move(tensor);
    }
    std::cout << "bsa-guard-zones: " << kGuardBytes << std::endl;
    auto output = [&](const char *name) -> aclTensor * {
        auto it = outputs.find(name);
        return it == outputs.end() ? nullptr : it->second->tensor.get();
    };
    if (options.fill == "nan") {
        std::cout << "bsa-prefilled-outputs: nan" << std::endl;  // bsa run records it (device.prefilled_outputs)
    }

    std::vector<int64_t> values;
    IntArrayPtr blockShape = spec.ListParam("block_shape", &values) ? MakeIntArray(values, "blockShape") : nullptr;
    const bool bnsd = spec.Param("layout") == "BNSD";
    // The forward's lengths are the case's; a BNSD case with neither passes [S] * B for both (the forward takes
    // both-or-neither, and the chain's backward reads actualSeqLengths[b] even for BNSD, as torch_npu's
    // autograd hands it the forward's). A case with one list and not the other passes exactly that.
    std::vector<int64_t> qValues, kvValues;
    const bool qGiven = spec.ListParam("actual_seq_lengths", &qValues);
    const bool kvGiven = spec.ListParam("actual_seq_lengths_kv", &kvValues);
    IntArrayPtr qLengths, kvLengths;
    if (bnsd && !qGiven && !kvGiven) {
        const size_t batch = static_cast<size_t>(spec.IntParam("batch"));
        qLengths = MakeIntArray(std::vector<int64_t>(batch, spec.IntParam("q_seq_len")), "actualSeqLengths");
        kvLengths = MakeIntArray(std::vector<int64_t>(batch, spec.IntParam("kv_seq_len")), "actualSeqLengthsKv");
    } else {
        qLengths = qGiven ? MakeIntArray(qValues, "actualSeqLengths") : nullptr;
        kvLengths = kvGiven ? MakeIntArray(kvValues, "actualSeqLengthsKv") : nullptr;
    }
    std::vector<char> qLayout = LayoutBuffer(spec.Param("layout"));
    std::vector<char> kvLayout = LayoutBuffer(spec.Param("kv_layout"));
    bool nullQLayout = false, nullKvLayout = false;
    if (auto it = spec.params.find("null_layouts"); it != spec.params.end()) {
        std::istringstream words(it->second);
        for (std::string word; words >> word;) {
            nullQLayout = nullQLayout || word == "q";
            nullKvLayout = nullKvLayout || word == "kv";
        }
    }
    const int64_t numKvHeads = spec.IntParam("num_kv_heads");
    const int64_t maskType = spec.IntParam("mask_type");
    const double scale = spec.DoubleParamOr("forward_scale", spec.DoubleParam("scale"));
    const int64_t preTokens = spec.IntParam("pre_tokens");
    const int64_t nextTokens = spec.IntParam("next_tokens");

    auto forwardFirstPhase = [&](uint64_t *workspaceSize, aclOpExecutor **executor) {
        return aclnnBlockSparseAttentionGetWorkspaceSize(
            input("query"), input("key"), input("value"), input("block_sparse_mask"), input("atten_mask"),
            blockShape.get(), qLengths.get(), kvLengths.get(), input("block_table"),
            nullQLayout ? nullptr : qLayout.data(), nullKvLayout ? nullptr : kvLayout.data(), numKvHeads, maskType,
            scale, spec.IntParamOr("inner_precise", 0), 0 /* blockSize: no paged cache */, preTokens, nextTokens,
            spec.IntParamOr("softmax_lse_flag", 1), output("out"), output("lse"), workspaceSize, executor);
    };
    // The forward's timed calls (after the judged ones, whose outputs are written by then): out and lse
    // filled again before each, as before the judged call.
    auto timeForward = [&] {
        TimeStep(options, session.stream(), "forward", [&](auto startClock, auto stopClock) {
            for (const char *name : {"out", "lse"}) {
                if (outputs.count(name)) {
                    Prefill(*outputs[name], options.fill);
                }
            }
            uint64_t size = 0;
            ExecutorGuard timed;
            CheckTimedStatus(forwardFirstPhase(&size, timed.out()), "aclnnBlockSparseAttentionGetWorkspaceSize");
            DeviceBuffer workspace(static_cast<size_t>(size));
            startClock();
            const aclnnStatus launched = aclnnBlockSparseAttention(workspace.get(), size, timed.release(),
                                                                   session.stream());
            stopClock();
            CheckTimedStatus(launched, "aclnnBlockSparseAttention");
        });
    };
    auto checkGuards = [&](std::initializer_list<const char *> names) {
        for (const char *name : names) {
            if (outputs.count(name)) {
                CheckGuards(name, *outputs[name]);
            }
        }
    };
    uint64_t workspaceSize = 0;
    ExecutorGuard executor;
    aclnnStatus status = forwardFirstPhase(&workspaceSize, executor.out());
    if (status != 0) {
        const std::string message = "aclnnBlockSparseAttentionGetWorkspaceSize: " + RecentAclMessage();
        std::cout << message << " (status " << status << ")" << std::endl;
        WriteStatus(options.outputDir, status, message);
        return kExitOk;
    }
    std::cout << "forward workspace " << workspaceSize << " bytes" << std::endl;
    {
        DeviceBuffer workspace(static_cast<size_t>(workspaceSize));
        status = aclnnBlockSparseAttention(workspace.get(), workspaceSize, executor.release(), session.stream());
        if (status != 0) {
            const std::string message = "aclnnBlockSparseAttention: " + RecentAclMessage();
            std::cout << message << " (status " << status << ")" << std::endl;
            WriteStatus(options.outputDir, status, message);
            return kExitOk;
        }
        CheckAcl(aclrtSynchronizeStream(session.stream()), "aclrtSynchronizeStream");
    }
    for (const char *name : {"out", "lse"}) {
        if (outputs.count(name)) {
            Download(*outputs[name], options.outputDir);
        }
    }
    if (!chain) {
        checkGuards({"out", "lse"});
        timeForward();
        WriteStatus(options.outputDir, 0, "");  // last: a status of 0 promises complete output files
        return kExitOk;
    }

    // The backward on the forward's own out and lse; the mask converted on the host from the forward's int8
    // bytes to the backward's dtype (bool: nonzero -> 1; uint8 and int8: the same bytes).
    const bool hasMask = maskLine != spec.inputs.end();
    const std::string backwardMaskDtype = !options.maskDtype.empty() ? options.maskDtype
                                          : hasMask                  ? maskLine->second.dtype
                                                                     : "uint8";
    std::vector<char> backwardMask = host["block_sparse_mask"];
    if (backwardMaskDtype == "bool") {
        for (char &byte : backwardMask) {
            byte = byte != 0 ? 1 : 0;
        }
    }
    if (maskLine == spec.inputs.end()) {
        throw HarnessError(kExitBadInput, "case.txt: a chain needs a block_sparse_mask input line");
    }
    auto mask = Upload(maskLine->second, backwardMask, backwardMaskDtype);
    std::cout << "chain: forward mask int8, backward mask " << backwardMaskDtype << std::endl;
    auto backwardLengths = [&](const char *key, const char *seqKey, const char *what) -> IntArrayPtr {
        if (spec.ListParam(key, &values)) {
            return MakeIntArray(values, what);
        }
        if (!bnsd) {
            return nullptr;
        }
        values.assign(static_cast<size_t>(spec.IntParam("batch")), spec.IntParam(seqKey));
        return MakeIntArray(values, what);
    };
    IntArrayPtr bqLengths = backwardLengths("actual_seq_lengths", "q_seq_len", "actualSeqLengths");
    IntArrayPtr bkvLengths = backwardLengths("actual_seq_lengths_kv", "kv_seq_len", "actualSeqLengthsKv");
    const double backwardScale = spec.DoubleParamOr("backward_scale", spec.DoubleParam("scale"));
    auto backwardFirstPhase = [&](uint64_t *workspaceSize, aclOpExecutor **executor) {
        return aclnnBlockSparseAttentionGradGetWorkspaceSize(
            input("dout"), input("query"), input("key"), input("value"), output("out"), output("lse"),
            mask->tensor.get(), nullptr, blockShape.get(), bqLengths.get(), bkvLengths.get(),
            nullQLayout ? nullptr : qLayout.data(), nullKvLayout ? nullptr : kvLayout.data(), numKvHeads, maskType,
            backwardScale, preTokens, nextTokens, output("dq"), output("dk"), output("dv"), workspaceSize, executor);
    };
    uint64_t gradWorkspaceSize = 0;
    ExecutorGuard gradExecutor;
    status = backwardFirstPhase(&gradWorkspaceSize, gradExecutor.out());
    if (status != 0) {
        const std::string message = "aclnnBlockSparseAttentionGradGetWorkspaceSize: " + RecentAclMessage();
        std::cout << message << " (status " << status << ")" << std::endl;
        WriteStatus(options.outputDir, status, message);  // out and lse stay written; no gradients
        return kExitOk;
    }
    std::cout << "backward workspace " << gradWorkspaceSize << " bytes" << std::endl;
    DeviceBuffer gradWorkspace(static_cast<size_t>(gradWorkspaceSize));
    status = aclnnBlockSparseAttentionGrad(gradWorkspace.get(), gradWorkspaceSize, gradExecutor.release(),
                                           session.stream());
    if (status != 0) {
        const std::string message = "aclnnBlockSparseAttentionGrad: " + RecentAclMessage();
        std::cout << message << " (status " << status << ")" << std::endl;
        WriteStatus(options.outputDir, status, message);
        return kExitOk;
    }
    CheckAcl(aclrtSynchronizeStream(session.stream()), "aclrtSynchronizeStream");
    for (const char *name : {"dq", "dk", "dv"}) {
        if (outputs.count(name)) {
            Download(*outputs[name], options.outputDir);
        }
    }
    checkGuards({"out", "lse", "dq", "dk", "dv"});
    // Each step of the chain timed apart: the backward's timed calls read the judged forward's out and lse,
    // which the forward's timed calls (after them) write again with the same call.
    TimeStep(options, session.stream(), "backward", [&](auto startClock, auto stopClock) {
        for (const char *name : {"dq", "dk", "dv"}) {
            if (outputs.count(name)) {
                FillOutput(*outputs[name], options.fill);
            }
        }
        uint64_t size = 0;
        ExecutorGuard timed;
        CheckTimedStatus(backwardFirstPhase(&size, timed.out()), "aclnnBlockSparseAttentionGradGetWorkspaceSize");
        DeviceBuffer workspace(static_cast<size_t>(size));
        startClock();
        const aclnnStatus launched = aclnnBlockSparseAttentionGrad(workspace.get(), size, timed.release(),
                                                                   session.stream());
        stopClock();
        CheckTimedStatus(launched, "aclnnBlockSparseAttentionGrad");
    });
    timeForward();
    WriteStatus(options.outputDir, 0, "");  // last: a status of 0 promises complete output files
    return kExitOk;
#endif
}

int Run(const Options &options)
{
    const std::string caseDir = CaseDir(options.manifest);
    const CaseSpec spec = ReadCase(caseDir + "/case.txt");
    std::cout << "case " << spec.Param("name") << " on device " << options.deviceId << std::endl;
    const std::string op = spec.params.count("op") ? spec.Param("op") : "backward";
    if (op == "autograd") {
        throw CannotRun("autograd is the chain through torch_npu's autograd (out.backward(dout)); this harness "
                        "calls aclnn itself: run the case with --device torch_npu");
    }
    if (op == "forward" || op == "chain") {
        return RunForwardOp(options, caseDir, spec, op == "chain");
    }
    if (op != "backward") {
        throw HarnessError(kExitBadInput, "case.txt: op '" + op + "' is not forward, backward, chain or autograd");
    }

    // Host data first: a bad or stale file fails before the device is touched.
    // atten_mask is passed only when a (negative) case gives one; otherwise attenMask is null.
    static const char *kInputs[] = {"dout", "query", "key", "value", "attention_out", "softmax_lse",
                                    "block_sparse_mask", "atten_mask"};
    std::map<std::string, std::vector<char>> host;
    for (const char *name : kInputs) {
        auto it = spec.inputs.find(name);
        if (it != spec.inputs.end()) {
            const ArraySpec &array = it->second;
            const size_t bytes = ElementCount(array.dims) * Dtype(array.dtype).size;
            host[name] = ReadFile(Inside(caseDir, array.file, true), bytes);
        }
    }
    for (const char *name : {"dq", "dk", "dv"}) {
        if (spec.outputs.find(name) == spec.outputs.end()) {
            throw HarnessError(kExitBadInput, std::string("case.txt has no 'output ") + name + "' line");
        }
        Inside(options.outputDir, spec.outputs.at(name).file, false);  // every output checked before any is written
    }

    AclSession session(options.deviceId, options.deterministic);

    // Inputs (an input the case leaves out is passed as nullptr: negative cases).
    std::map<std::string, std::unique_ptr<DeviceTensor>> inputs;
    for (const char *name : kInputs) {
        auto it = spec.inputs.find(name);
        if (it == spec.inputs.end()) {
            continue;
        }
        const bool isMask = std::string(name) == "block_sparse_mask";
        auto tensor = MakeTensor(it->second, isMask ? options.maskDtype : "");
        const std::vector<char> &data = host[name];
        if (!data.empty()) {
            CheckAcl(aclrtMemcpy(tensor->data(), tensor->bytes(), data.data(), data.size(),
                                 ACL_MEMCPY_HOST_TO_DEVICE),
                     "aclrtMemcpy (host to device)");
        }
        inputs[name] = std::move(tensor);
    }
    auto input = [&](const char *name) -> const aclTensor * {
        auto it = inputs.find(name);
        return it == inputs.end() ? nullptr : it->second->tensor.get();
    };

    std::map<std::string, std::unique_ptr<DeviceTensor>> grads;
    for (const char *name : {"dq", "dk", "dv"}) {
        auto tensor = MakeTensor(spec.outputs.at(name), "", true);  // guarded: a write outside it shows
        FillOutput(*tensor, options.fill);
        grads[name] = std::move(tensor);
    }
    std::cout << "bsa-guard-zones: " << kGuardBytes << std::endl;

    std::vector<int64_t> values;
    IntArrayPtr blockShape = spec.ListParam("block_shape", &values) ? MakeIntArray(values, "blockShape") : nullptr;
    // A BNSD case without lengths passes [S] * B, never null: the A2/A3 post-processing reads
    // actualSeqLengths[b] even for BNSD (as the operator's example and torch_npu's tests pass them).
    const bool bnsd = spec.Param("layout") == "BNSD";
    auto lengths = [&](const char *key, const char *seqKey, const char *what) -> IntArrayPtr {
        if (spec.ListParam(key, &values)) {
            return MakeIntArray(values, what);
        }
        if (!bnsd) {
            return nullptr;  // TND without lengths: a negative case
        }
        values.assign(static_cast<size_t>(spec.IntParam("batch")), spec.IntParam(seqKey));
        return MakeIntArray(values, what);
    };
    IntArrayPtr qLengths = lengths("actual_seq_lengths", "q_seq_len", "actualSeqLengths");
    IntArrayPtr kvLengths = lengths("actual_seq_lengths_kv", "kv_seq_len", "actualSeqLengthsKv");
    std::vector<char> qLayout = LayoutBuffer(spec.Param("layout"));
    std::vector<char> kvLayout = LayoutBuffer(spec.Param("kv_layout"));
    // `null_layouts q kv` (negative cases): pass that layout string as a null pointer.
    bool nullQLayout = false, nullKvLayout = false;
    if (auto it = spec.params.find("null_layouts"); it != spec.params.end()) {
        std::istringstream words(it->second);
        for (std::string word; words >> word;) {
            nullQLayout = nullQLayout || word == "q";
            nullKvLayout = nullKvLayout || word == "kv";
        }
    }

    const int64_t numKvHeads = spec.IntParam("num_kv_heads"), maskType = spec.IntParam("mask_type");
    const double scale = spec.DoubleParam("scale");
    const int64_t preTokens = spec.IntParam("pre_tokens"), nextTokens = spec.IntParam("next_tokens");
    auto firstPhase = [&](uint64_t *workspaceSize, aclOpExecutor **executor) {
        return aclnnBlockSparseAttentionGradGetWorkspaceSize(
            input("dout"), input("query"), input("key"), input("value"), input("attention_out"),
            input("softmax_lse"), input("block_sparse_mask"),
            input("atten_mask") /* null unless a negative case gives one */, blockShape.get(), qLengths.get(),
            kvLengths.get(), nullQLayout ? nullptr : qLayout.data(), nullKvLayout ? nullptr : kvLayout.data(),
            numKvHeads, maskType, scale, preTokens, nextTokens, grads["dq"]->tensor.get(), grads["dk"]->tensor.get(),
            grads["dv"]->tensor.get(), workspaceSize, executor);
    };
    uint64_t workspaceSize = 0;
    ExecutorGuard executor;
    aclnnStatus status = firstPhase(&workspaceSize, executor.out());
    if (status != 0) {
        const std::string message = "aclnnBlockSparseAttentionGradGetWorkspaceSize: " + RecentAclMessage();
        std::cout << message << " (status " << status << ")" << std::endl;
        WriteStatus(options.outputDir, status, message);
        return kExitOk;
    }
    std::cout << "workspace " << workspaceSize << " bytes" << std::endl;

    {
        DeviceBuffer workspace(static_cast<size_t>(workspaceSize));
        status = aclnnBlockSparseAttentionGrad(workspace.get(), workspaceSize, executor.release(), session.stream());
        if (status != 0) {
            const std::string message = "aclnnBlockSparseAttentionGrad: " + RecentAclMessage();
            std::cout << message << " (status " << status << ")" << std::endl;
            WriteStatus(options.outputDir, status, message);
            return kExitOk;
        }
        CheckAcl(aclrtSynchronizeStream(session.stream()), "aclrtSynchronizeStream");
    }

    for (const char *name : {"dq", "dk", "dv"}) {
        const DeviceTensor &grad = *grads[name];
        std::vector<char> data(grad.bytes());
        if (!data.empty()) {
            CheckAcl(aclrtMemcpy(data.data(), data.size(), grad.data(), grad.bytes(), ACL_MEMCPY_DEVICE_TO_HOST),
                     "aclrtMemcpy (device to host)");
        }
        WriteFile(Inside(options.outputDir, grad.spec.file, false), data.data(), data.size());
    }
    for (const char *name : {"dq", "dk", "dv"}) {
        CheckGuards(name, *grads[name]);
    }
    // The timed calls come after the judged one, whose outputs are already written: nothing they do changes
    // what is judged. The backward writes none of its inputs, so only its outputs are filled again.
    TimeStep(options, session.stream(), "backward", [&](auto startClock, auto stopClock) {
        for (const char *name : {"dq", "dk", "dv"}) {
            FillOutput(*grads[name], options.fill);
        }
        uint64_t size = 0;
        ExecutorGuard timed;
        CheckTimedStatus(firstPhase(&size, timed.out()), "aclnnBlockSparseAttentionGradGetWorkspaceSize");
        DeviceBuffer workspace(static_cast<size_t>(size));
        startClock();
        const aclnnStatus launched = aclnnBlockSparseAttentionGrad(workspace.get(), size, timed.release(),
                                                                   session.stream());
        stopClock();
        CheckTimedStatus(launched, "aclnnBlockSparseAttentionGrad");
    });
    WriteStatus(options.outputDir, 0, "");  // last: a status of 0 promises complete gradient files
    return kExitOk;
}

}  // namespace

int main(int argc, char **argv)
{
    try {
        return Run(ParseArgs(argc, argv));
    } catch (const CannotRun &why) {
        std::cerr << "cannot run: " << why.what() << std::endl;
        return kExitCannotRun;
    } catch (const HarnessError &error) {
        std::cerr << "bsa_grad_harness: " << error.what() << std::endl;
        return error.exitCode();
    } catch (const std::exception &error) {
        std::cerr << "bsa_grad_harness: " << error.what() << std::endl;
        return kExitRuntime;
    }
}
