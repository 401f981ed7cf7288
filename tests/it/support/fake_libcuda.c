/* A stand-in for the NVIDIA driver library (libcuda.so.1) with just the entry points
 * Strata calls before it touches a device: it lets tests/cuda_errors.rs check, on a
 * machine without a GPU, what `--device cuda` says when the driver sees no device, when
 * cuInit fails, and when NVRTC is missing. Not a driver: any other call is absent, and
 * cudarc would panic on it, so the tests never get that far.
 *
 * FAKE_CUDA_INIT: the CUresult cuInit returns (default 0, success).
 * FAKE_CUDA_COUNT: the device count it reports (default 0). */
#include <stdlib.h>

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v ? atoi(v) : dflt;
}

int cuInit(unsigned int flags) {
    (void)flags;
    return env_int("FAKE_CUDA_INIT", 0);
}

int cuDriverGetVersion(int *version) {
    *version = 13000;
    return 0;
}

int cuDeviceGetCount(int *count) {
    *count = env_int("FAKE_CUDA_COUNT", 0);
    return 0;
}

int cuGetErrorString(int error, const char **str) {
    *str = error == 100 ? "no CUDA-capable device is detected" : "fake driver error";
    return 0;
}

int cuGetErrorName(int error, const char **str) {
    *str = error == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
