// FAKE, declaration-only stand-in for CANN's aclnn/acl_meta.h, for compiling bsa's harness in CI.
// Only what harness/bsa_grad_harness.cpp uses; signatures follow the real header.
#ifndef BSA_FAKE_ACLNN_ACL_META_H
#define BSA_FAKE_ACLNN_ACL_META_H

#include <cstdint>

#include "acl/acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t aclnnStatus;
typedef struct aclOpExecutor aclOpExecutor;
typedef struct aclTensor aclTensor;
typedef struct aclIntArray aclIntArray;

aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType, const int64_t *stride,
                           int64_t offset, aclFormat format, const int64_t *storageDims, uint64_t storageDimsNum,
                           void *tensorData);
aclnnStatus aclDestroyTensor(const aclTensor *tensor);
aclIntArray *aclCreateIntArray(const int64_t *value, uint64_t size);
aclnnStatus aclDestroyIntArray(const aclIntArray *array);
aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor);

#ifdef __cplusplus
}
#endif

#endif  // BSA_FAKE_ACLNN_ACL_META_H
