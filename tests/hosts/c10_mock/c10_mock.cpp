#include "c10_mock.h"

namespace c10 {
Error::Error(SourceLocation loc, std::string msg)
    : msg_(std::move(msg)), where_(std::string(loc.function) + " at " + loc.file) {}
Error::~Error() = default;
const char *Error::what() const noexcept { return msg_.c_str(); }

namespace detail {
void torchCheckFail(const char *func, const char *file, uint32_t line, const char *msg) {
    throw Error({func, file, line}, msg);
}
} // namespace detail

/* makes the library define OutOfMemoryError's typeinfo and vtable, as libc10 does (its CPU allocator throws it) */
C10_MOCK_API void mock_throw_oom() { throw OutOfMemoryError({__func__, __FILE__, __LINE__}, "mock"); }
} // namespace c10
