/* A stand-in for the few parts of PyTorch's libc10 that pyvgpu's shim throws through (shim/src/pv_vpmm.c):
 * the names, signatures and class relations are PyTorch's (c10/util/Exception.h), the bodies are not.
 * tests/test_vpmm_torch.py builds it as libc10.so (c10_mock.cpp) and libc10_cuda.so (c10_cuda_mock.cpp),
 * with PyTorch's visibility flags, then checks that a refused VPMM malloc is thrown as
 * c10::OutOfMemoryError and any other failure as c10::Error, as the real PyTorch would see them.
 *
 * What the libraries export is PyTorch 2.11's (nm -D of its wheel): neither class declares a destructor, so
 * with -fvisibility-inlines-hidden no c10::Error::~Error is exported; OutOfMemoryError's typeinfo and
 * vtable are in libc10_cuda.so (its caching allocator throws the class), not in libc10.so. */
#pragma once
#include <cstdint>
#include <exception>
#include <string>

#define C10_MOCK_API __attribute__((visibility("default")))

namespace c10 {
struct SourceLocation {
    const char *function;
    const char *file;
    uint32_t line;
};

class C10_MOCK_API Error : public std::exception {
    std::string msg_;
    std::string where_;

  public:
    Error(SourceLocation loc, std::string msg);
    const char *what() const noexcept override;
    const std::string &msg() const { return msg_; }
};

class C10_MOCK_API OutOfMemoryError : public Error {
    using Error::Error;
};

namespace detail {
[[noreturn]] C10_MOCK_API void torchCheckFail(const char *func, const char *file, uint32_t line, const char *msg);
}
} // namespace c10
