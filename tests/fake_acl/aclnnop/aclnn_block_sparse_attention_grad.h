// FAKE, declaration-only copy of the operator's API header, for compiling bsa's harness in CI.
// The real one: CANN ops-transformer attention/block_sparse_attention_grad/op_host/op_api/
// aclnn_block_sparse_attention_grad.h (installed as include/aclnnop/, or a custom vendor's op_api/include/).
// The declarations must keep the real parameter order and types.
#ifndef BSA_FAKE_ACLNN_BLOCK_SPARSE_ATTENTION_GRAD_H
#define BSA_FAKE_ACLNN_BLOCK_SPARSE_ATTENTION_GRAD_H

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

aclnnStatus aclnnBlockSparseAttentionGradGetWorkspaceSize(
    const aclTensor *dout, const aclTensor *query, const aclTensor *key, const aclTensor *value,
    const aclTensor *attentionOut, const aclTensor *softmaxLse, const aclTensor *blockSparseMaskOptional,
    const aclTensor *attenMaskOptional, const aclIntArray *blockShapeOptional,
    const aclIntArray *actualSeqLengthsOptional, const aclIntArray *actualSeqLengthsKvOptional, char *qInputLayout,
    char *kvInputLayout, int64_t numKeyValueHeads, int64_t maskType, double scaleValue, int64_t preTokens,
    int64_t nextTokens, aclTensor *dq, aclTensor *dk, aclTensor *dv, uint64_t *workspaceSize,
    aclOpExecutor **executor);

aclnnStatus aclnnBlockSparseAttentionGrad(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                          const aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // BSA_FAKE_ACLNN_BLOCK_SPARSE_ATTENTION_GRAD_H
