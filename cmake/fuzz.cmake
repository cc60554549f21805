# cmake/fuzz.cmake - libFuzzer harnesses (fuzz/fuzz_*.c), built only with -DLMK_FUZZ=ON and clang.
#
# Each harness links its own copy of the library objects, compiled with the fuzzer's coverage
# instrumentation and ASan+UBSan, so that the normal targets of the same build tree keep the flags
# they were configured with. `make fuzz` (mk/hardening.mk) configures a dedicated build-fuzz tree.
option(LMK_FUZZ "Build the libFuzzer harnesses in fuzz/ (clang only)" OFF)

if(LMK_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(WARNING "lmk: LMK_FUZZ=ON needs clang (the compiler is ${CMAKE_C_COMPILER_ID}); no fuzzers are built")
  else()
    set(LMK_FUZZ_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g)
    file(GLOB LMK_FUZZ_LIB_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/core/*.c
         ${CMAKE_CURRENT_SOURCE_DIR}/src/ops/*/*.c ${CMAKE_CURRENT_SOURCE_DIR}/src/cpu/*.c)
    list(FILTER LMK_FUZZ_LIB_SOURCES EXCLUDE REGEX ".*/case\\.c$")
    add_library(lmk_fuzz_lib STATIC ${LMK_FUZZ_LIB_SOURCES})
    target_include_directories(lmk_fuzz_lib PUBLIC include src)
    target_compile_definitions(lmk_fuzz_lib PRIVATE
      LMK_BUILD_COMPILER="${CMAKE_C_COMPILER_ID}-${CMAKE_C_COMPILER_VERSION}"
      LMK_BUILD_TYPE="${CMAKE_BUILD_TYPE}-fuzz"
      LMK_BUILD_CUDA_ARCHS="")
    target_compile_options(lmk_fuzz_lib PRIVATE -fsanitize=fuzzer-no-link ${LMK_FUZZ_FLAGS})
    target_link_libraries(lmk_fuzz_lib PUBLIC Threads::Threads m)
    # The test kit and the ops' case descriptors (testkit/testkit.h), with the same instrumentation.
    file(GLOB LMK_FUZZ_CASES_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/testkit/*.c
         ${CMAKE_CURRENT_SOURCE_DIR}/src/ops/*/case.c)
    add_library(lmk_fuzz_cases STATIC ${LMK_FUZZ_CASES_SOURCES})
    target_include_directories(lmk_fuzz_cases PUBLIC testkit PRIVATE src)
    target_compile_options(lmk_fuzz_cases PRIVATE -fsanitize=fuzzer-no-link ${LMK_FUZZ_FLAGS})
    target_link_libraries(lmk_fuzz_cases PUBLIC lmk_fuzz_lib)

    file(GLOB LMK_FUZZERS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_*.c)
    set(LMK_FUZZ_TARGETS "")
    foreach(src ${LMK_FUZZERS})
      get_filename_component(name ${src} NAME_WE)
      add_executable(${name} ${src})
      target_include_directories(${name} PRIVATE include src fuzz testkit)
      target_compile_options(${name} PRIVATE -fsanitize=fuzzer ${LMK_FUZZ_FLAGS})
      target_link_options(${name} PRIVATE -fsanitize=fuzzer ${LMK_FUZZ_FLAGS})
      target_link_libraries(${name} PRIVATE lmk_fuzz_cases lmk_fuzz_lib)
      set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
      list(APPEND LMK_FUZZ_TARGETS ${name})
    endforeach()
    add_custom_target(fuzzers DEPENDS ${LMK_FUZZ_TARGETS})
    message(STATUS "lmk: fuzzers ${LMK_FUZZ_TARGETS}")
  endif()
endif()
