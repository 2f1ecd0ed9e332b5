# Driven by ctest (tests/CMakeLists.txt, test install_consumer): install the opforge build in
# OPFORGE_BUILD_DIR into a fresh prefix under WORK_DIR, then configure, build and run the consumer
# project in CONSUMER_SOURCE_DIR against that prefix only.
cmake_minimum_required(VERSION 3.25)

foreach(var OPFORGE_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(step what)
  message(STATUS "install_consumer: ${what}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: ${what} failed (${rc})")
  endif()
endfunction()

step("install into ${prefix}"
  ${CMAKE_COMMAND} --install ${OPFORGE_BUILD_DIR} --prefix ${prefix})
if(NOT EXISTS ${prefix}/include/opforge/ops/norm/norm.h)
  message(FATAL_ERROR "install_consumer: ops headers missing under ${prefix}/include/opforge/ops")
endif()
step("configure the consumer"
  ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${build} -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
    "-DCMAKE_EXE_LINKER_FLAGS=${CXX_FLAGS}"
    -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
step("build the consumer" ${CMAKE_COMMAND} --build ${build})
step("run the consumer" ${build}/opforge_consumer)
