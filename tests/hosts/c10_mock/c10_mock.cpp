#include "c10_mock.h"

namespace c10 {
Error::Error(SourceLocation loc, std::string msg)
    : msg_(std::move(msg)), where_(std::string(loc.function) + " at " + loc.file) {}
const char *Error::what() const noexcept { return msg_.c_str(); }

namespace detail {
void torchCheckFail(const char *func, const char *file, uint32_t line, const char *msg) {
    throw Error({func, file, line}, msg);
}
} // namespace detail
} // namespace c10
