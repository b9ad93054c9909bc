// FAKE, declaration-only stand-in for CANN's acl/acl_base.h, for compiling bsa's harness in CI.
// Only what harness/bsa_grad_harness.cpp uses; values and signatures follow the real header.
#ifndef BSA_FAKE_ACL_ACL_BASE_H
#define BSA_FAKE_ACL_ACL_BASE_H

#include <cstddef>
#include <cstdint>

#ifdef __cplusplus
extern "C" {
#endif

typedef int aclError;
typedef void *aclrtStream;
typedef void *aclrtEvent;

static const int ACL_SUCCESS = 0;

typedef enum {
    ACL_DT_UNDEFINED = -1,
    ACL_FLOAT = 0,
    ACL_FLOAT16 = 1,
    ACL_INT8 = 2,
    ACL_INT32 = 3,
    ACL_UINT8 = 4,
    ACL_INT16 = 6,
    ACL_UINT16 = 7,
    ACL_UINT32 = 8,
    ACL_INT64 = 9,
    ACL_UINT64 = 10,
    ACL_DOUBLE = 11,
    ACL_BOOL = 12,
    ACL_STRING = 13,
    ACL_COMPLEX64 = 16,
    ACL_COMPLEX128 = 17,
    ACL_BF16 = 27,
} aclDataType;

typedef enum {
    ACL_FORMAT_UNDEFINED = -1,
    ACL_FORMAT_NCHW = 0,
    ACL_FORMAT_NHWC = 1,
    ACL_FORMAT_ND = 2,
} aclFormat;

const char *aclGetRecentErrMsg();

#ifdef __cplusplus
}
#endif

#endif  // BSA_FAKE_ACL_ACL_BASE_H
