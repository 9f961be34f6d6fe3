// Builds without the CUDA backend (no nvcc, or KVC_CUDA=OFF): a pool asked
// for KVC_DEVICE_CUDA is refused with KVC_ERR_DEVICE_UNAVAILABLE.
#include "backend.h"
#include "common/error.h"

namespace kvc::cuda {

bool Device::compiled() {
  return false;
}

std::unique_ptr<Device> Device::open(int, uint64_t, const Geometry &) {
  fail(Errc::DeviceUnavailable,
       "device CUDA: this build of libkvcache has no CUDA backend (built without nvcc or with "
       "KVC_CUDA=OFF)");
}

}  // namespace kvc::cuda
