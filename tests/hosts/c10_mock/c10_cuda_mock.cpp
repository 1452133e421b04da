#include "c10_mock.h"

/* makes the library define OutOfMemoryError's typeinfo and vtable, as libc10_cuda does (its caching
 * allocator throws the class); its destructor stays hidden, as PyTorch's */
namespace c10 {
C10_MOCK_API void mock_cuda_throw_oom() { throw OutOfMemoryError({__func__, __FILE__, __LINE__}, "mock"); }
} // namespace c10
