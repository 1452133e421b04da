/* A stand-in for the few parts of PyTorch's libc10 that pyvgpu's shim throws through (shim/src/pv_vpmm.c):
 * the names, signatures and class relations are PyTorch's (c10/util/Exception.h), the bodies are not.
 * tests/test_vpmm_torch.py builds it as libc10.so, then checks that a refused VPMM malloc is thrown as
 * c10::OutOfMemoryError and any other failure as c10::Error, as the real PyTorch would see them. */
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
    ~Error() override;
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
