# One ctest entry per harness mode, over the real registry (CPU kernels on this machine).
add_test(NAME harness.test COMMAND opforge_cli check --mode test)
add_test(NAME harness.grad COMMAND opforge_cli check --mode grad)
add_test(NAME harness.perf COMMAND opforge_cli bench --group small --samples 3)
add_test(NAME harness.support COMMAND opforge_cli support --out ${CMAKE_CURRENT_BINARY_DIR}/ops.md)
set_tests_properties(harness.test harness.grad harness.perf harness.support PROPERTIES TIMEOUT 900)
