// FAKE, declaration-only copy of the forward operator's API header, for compiling bsa's harness in CI.
// The real one: CANN ops-transformer attention/block_sparse_attention/op_host/op_api/
// aclnn_block_sparse_attention.h (master 5778144; installed as include/aclnnop/, or a custom vendor's
// op_api/include/). The declarations keep the real parameter order and types.
#ifndef BSA_FAKE_ACLNN_BLOCK_SPARSE_ATTENTION_H
#define BSA_FAKE_ACLNN_BLOCK_SPARSE_ATTENTION_H

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

aclnnStatus aclnnBlockSparseAttentionGetWorkspaceSize(
    const aclTensor *query, const aclTensor *key, const aclTensor *value, const aclTensor *blockSparseMaskOptional,
    const aclTensor *attenMaskOptional, const aclIntArray *blockShapeOptional,
    const aclIntArray *actualSeqLengthsOptional, const aclIntArray *actualSeqLengthsKvOptional,
    const aclTensor *blockTableOptional, char *qInputLayout, char *kvInputLayout, int64_t numKeyValueHeads,
    int64_t maskType, double scaleValue, int64_t innerPrecise, int64_t blockSize, int64_t preTokens,
    int64_t nextTokens, int64_t softmaxLseFlag, aclTensor *attentionOut, aclTensor *softmaxLseOptional,
    uint64_t *workspaceSize, aclOpExecutor **executor);

aclnnStatus aclnnBlockSparseAttention(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                      aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // BSA_FAKE_ACLNN_BLOCK_SPARSE_ATTENTION_H
