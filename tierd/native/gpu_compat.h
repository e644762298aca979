/* One GPU source for two runtimes: gpu* names map to cuda* (nvcc) or hip* (hipcc, where
 * __HIP_PLATFORM_AMD__ or WG_HIP is defined). Only the runtime API the copy backend uses. */
#ifndef WG_GPU_COMPAT_H
#define WG_GPU_COMPAT_H

#if defined(WG_HIP) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_HCC__)
#include <hip/hip_runtime_api.h>
#define WG_RUNTIME_NAME "hip"
typedef hipError_t gpuError_t;
typedef hipStream_t gpuStream_t;
#define gpuSuccess hipSuccess
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuRuntimeGetVersion hipRuntimeGetVersion
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuSetDevice hipSetDevice
#define gpuDeviceProp hipDeviceProp_t
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuHostRegister hipHostRegister
#define gpuHostUnregister hipHostUnregister
#define gpuHostRegisterPortable hipHostRegisterPortable
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyDefault hipMemcpyDefault
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuStreamDestroy hipStreamDestroy
typedef hipEvent_t gpuEvent_t;
#define gpuErrorNotReady hipErrorNotReady
#define gpuEventCreateWithFlags hipEventCreateWithFlags
#define gpuEventDisableTiming hipEventDisableTiming
#define gpuEventRecord hipEventRecord
#define gpuEventQuery hipEventQuery
#define gpuEventSynchronize hipEventSynchronize
#define gpuEventDestroy hipEventDestroy
#define gpuStreamWaitEvent hipStreamWaitEvent
#else
#include <cuda_runtime_api.h>
#define WG_RUNTIME_NAME "cuda"
typedef cudaError_t gpuError_t;
typedef cudaStream_t gpuStream_t;
#define gpuSuccess cudaSuccess
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuRuntimeGetVersion cudaRuntimeGetVersion
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuSetDevice cudaSetDevice
#define gpuDeviceProp cudaDeviceProp
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuHostRegister cudaHostRegister
#define gpuHostUnregister cudaHostUnregister
#define gpuHostRegisterPortable cudaHostRegisterPortable
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyDefault cudaMemcpyDefault
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuStreamDestroy cudaStreamDestroy
typedef cudaEvent_t gpuEvent_t;
#define gpuErrorNotReady cudaErrorNotReady
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuEventRecord cudaEventRecord
#define gpuEventQuery cudaEventQuery
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventDestroy cudaEventDestroy
#define gpuStreamWaitEvent cudaStreamWaitEvent
/* cudaMemcpyBatchAsync: CUDA 12.8 (with a failIdx argument), CUDA 13 (without). */
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12080
#define WG_HAVE_BATCH_COPY 1
#endif
#endif

#endif
