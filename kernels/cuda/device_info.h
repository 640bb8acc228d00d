/* CUDA device discovery, callable from C.  Only linked when the build has
 * CUDA (LLM_HAVE_CUDA). */
#ifndef LLM_CUDA_DEVICE_INFO_H
#define LLM_CUDA_DEVICE_INFO_H

#ifdef __cplusplus
extern "C" {
#endif

int llm_cuda_device_count(void);
int llm_cuda_device_name(int dev, char *buf, int len);

#ifdef __cplusplus
}
#endif

#endif
