# cmake/install.cmake — fsdpcheck as an installable package (ISSUE 13).
#
# Included once from the top-level CMakeLists.txt, after oracle/ (it needs
# the fsdpcheck executable and the in-tree libraries) and before the
# directories that consume the package interface (tests/, optimized/).
#
#   cmake --install build --prefix P     installs
#     P/bin/fsdpcheck
#     P/include/fsdpcheck/impl.h + exactly the headers impl.h includes
#     P/<libdir>/libfsdpcheck_core.{so,a}, libfsdpcheck_reference.{so,a}
#     P/<libdir>/cmake/fsdpcheck/   the CMake package (find_package(fsdpcheck 0.2)),
#                                   with fsdpcheck_add_gate() (FsdpcheckGate.cmake)
#     P/<libdir>/pkgconfig/fsdpcheck.pc, fsdpcheck-reference.pc
#     P/lib/fsdpcheck/libfsdpcheck_cuda.so   the CUDA port, where it is built
#     P/share/doc/fsdpcheck/examples/plugin  the port template
#   cpack -G DEB                          builds the Debian 12 package of the same tree.
#
# The in-tree targets (fc_core, fc_reference, ...) are unchanged: the
# installed libraries are new targets linked from their object files, so
# nothing is compiled twice. The same names a port uses out of tree exist in
# tree as ALIAS targets (fsdpcheck::core, fsdpcheck::reference,
# fsdpcheck::fsdpcheck) and fsdpcheck_add_gate() is available. optimized/ does
# not use them yet: it links fc_core and includes core/'s layout, clip,
# checkpoint-protocol, init and data headers, which the package does not
# install (the public set below is impl.h's closure only).
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FSDPCHECK_CMAKE_DIR ${CMAKE_CURRENT_LIST_DIR})
set(FSDPCHECK_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/fsdpcheck)

# ---- the public contract headers --------------------------------------------
# impl.h and exactly its include closure (no cJSON, no OpenSSL header: config.h
# only forward-declares struct cJSON). tests/abi/header_selfcontained.sh
# compiles <fsdpcheck/impl.h> against the installed tree with nothing but the
# MPI include path, so a header added to impl.h's includes and not here fails
# a test. Consumers write #include <fsdpcheck/impl.h>.
set(FSDPCHECK_PUBLIC_HEADERS
  impl.h check.h checkpoint.h config.h dtype.h fileio.h hd.h model.h round.h safetensors.h schedule.h sha256.h)
# The same set mirrored into the build tree, so in-tree consumers of
# fsdpcheck::core see exactly what an installed port sees.
set(FSDPCHECK_BUILD_INCLUDEDIR ${PROJECT_BINARY_DIR}/include)
set(_fc_public_headers)
foreach(h ${FSDPCHECK_PUBLIC_HEADERS})
  configure_file(${PROJECT_SOURCE_DIR}/core/${h} ${FSDPCHECK_BUILD_INCLUDEDIR}/fsdpcheck/${h} COPYONLY)
  list(APPEND _fc_public_headers ${PROJECT_SOURCE_DIR}/core/${h})
endforeach()

# ---- dependencies, by the names the package config finds them ---------------
# cJSON: Debian's libcjson-dev ships a CMake package (target `cjson`); where it
# does not, the library found by the top-level find_library stands in.
find_package(cJSON CONFIG QUIET)
if(NOT TARGET cjson)
  add_library(cjson UNKNOWN IMPORTED)
  set_target_properties(cjson PROPERTIES IMPORTED_LOCATION ${CJSON_LIB})
endif()

# ---- the installed libraries: core and reference, shared and static ---------
# Built from the in-tree libraries' objects (all compiled PIC). The reference
# library holds the three builds of impl.h's entry points: fc_reference_impl(),
# the fault catalogue's fc_reference_faults_impl() (their internal names
# differ, reference/faults/seams.h) and the magnitude pass's
# fc_reference_magnitude_impl() (its own names, core/real.h).
set(_fc_core_objs $<TARGET_OBJECTS:fc_core>)
set(_fc_ref_objs $<TARGET_OBJECTS:fc_reference> $<TARGET_OBJECTS:fc_refmath> $<TARGET_OBJECTS:fc_reference_faults>
    $<TARGET_OBJECTS:fc_reference_magnitude>)
set(_fc_incs $<BUILD_INTERFACE:${FSDPCHECK_BUILD_INCLUDEDIR}> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set(_fc_soversion ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})  # 0.x: a minor version may break

add_library(fsdpcheck_core SHARED ${_fc_core_objs})
add_library(fsdpcheck_core_static STATIC ${_fc_core_objs})
add_library(fsdpcheck_reference SHARED ${_fc_ref_objs})
add_library(fsdpcheck_reference_static STATIC ${_fc_ref_objs})
foreach(t fsdpcheck_core fsdpcheck_core_static fsdpcheck_reference fsdpcheck_reference_static)
  target_include_directories(${t} INTERFACE ${_fc_incs})
  # impl.h includes <mpi.h>: MPI is public; cJSON, OpenSSL and libm are the
  # shared libraries' own business, link-only for the static ones
  target_link_libraries(${t} PUBLIC MPI::MPI_C)
endforeach()
# fc_core's own dependencies, by the names the package config finds them
# (a dependency added to fc_core and not known here stops the configure, so
# the installed libraries never miss one)
get_target_property(_fc_core_deps fc_core INTERFACE_LINK_LIBRARIES)
set(_fc_core_link)
foreach(d ${_fc_core_deps})
  if(d STREQUAL "${CJSON_LIB}")
    list(APPEND _fc_core_link cjson)
  elseif(d STREQUAL "${M_LIB}")
    list(APPEND _fc_core_link m)
  elseif(d MATCHES "^(OpenSSL::Crypto|Threads::Threads|OpenMP::OpenMP_C)$")
    list(APPEND _fc_core_link ${d})
  elseif(NOT d STREQUAL "MPI::MPI_C")
    message(FATAL_ERROR "cmake/install.cmake: fc_core links ${d}, unknown to the installed libraries: "
                        "map it here and find it in cmake/fsdpcheckConfig.cmake.in")
  endif()
endforeach()
target_link_libraries(fsdpcheck_core PRIVATE ${_fc_core_link})
target_link_libraries(fsdpcheck_core_static PUBLIC ${_fc_core_link})
target_link_libraries(fsdpcheck_reference PUBLIC fsdpcheck_core PRIVATE m)
target_link_libraries(fsdpcheck_reference_static PUBLIC fsdpcheck_core_static m)
set_target_properties(fsdpcheck_core PROPERTIES EXPORT_NAME core VERSION ${PROJECT_VERSION} SOVERSION ${_fc_soversion})
set_target_properties(fsdpcheck_reference PROPERTIES EXPORT_NAME reference VERSION ${PROJECT_VERSION}
                      SOVERSION ${_fc_soversion} INSTALL_RPATH "$ORIGIN")
set_target_properties(fsdpcheck_core_static PROPERTIES EXPORT_NAME core_static OUTPUT_NAME fsdpcheck_core
                      POSITION_INDEPENDENT_CODE ON)
set_target_properties(fsdpcheck_reference_static PROPERTIES EXPORT_NAME reference_static
                      OUTPUT_NAME fsdpcheck_reference POSITION_INDEPENDENT_CODE ON)

# The names a port uses, in tree too.
add_library(fsdpcheck::core ALIAS fsdpcheck_core)
add_library(fsdpcheck::core_static ALIAS fsdpcheck_core_static)
add_library(fsdpcheck::reference ALIAS fsdpcheck_reference)
add_library(fsdpcheck::reference_static ALIAS fsdpcheck_reference_static)
add_executable(fsdpcheck::fsdpcheck ALIAS fsdpcheck)

# ---- versions ----------------------------------------------------------------
# `fsdpcheck --version` prints the package version (and the contract's ABI
# version, FC_IMPL_ABI_VERSION, from impl.h itself).
target_compile_definitions(fsdpcheck PRIVATE FSDPCHECK_VERSION="${PROJECT_VERSION}")

# ---- the fault catalogue's names, for fsdpcheck_add_gate(... FAULTS) ----------
# Read from the one table the binary uses (core/config.c FAULT_NAMES), so the
# installed gate module registers exactly the faults this fsdpcheck knows.
file(READ ${PROJECT_SOURCE_DIR}/core/config.c _fc_config_c)
string(REGEX MATCH "FAULT_NAMES\\[FC_FAULT_COUNT\\] = {([^}]*)}" _fc_m "${_fc_config_c}")
string(REGEX MATCHALL "\"[a-z0-9_]+\"" _fc_names "${CMAKE_MATCH_1}")
string(REPLACE "\"" "" _fc_names "${_fc_names}")
list(REMOVE_ITEM _fc_names none)
list(LENGTH _fc_names _fc_n)
if(_fc_n LESS 10)
  message(FATAL_ERROR "cmake/install.cmake: cannot read the fault catalogue from core/config.c FAULT_NAMES")
endif()
set(FSDPCHECK_FAULTS ${_fc_names})
file(STRINGS ${PROJECT_SOURCE_DIR}/core/impl.h _fc_abi REGEX "^#define FC_IMPL_ABI_VERSION [0-9]+")
string(REGEX REPLACE ".* ([0-9]+)$" "\\1" FSDPCHECK_IMPL_ABI_VERSION "${_fc_abi}")
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/core/config.c ${PROJECT_SOURCE_DIR}/core/impl.h)

# fsdpcheck_add_gate() in tree (the installed package includes the same file)
include(${FSDPCHECK_CMAKE_DIR}/FsdpcheckGate.cmake)

# ---- install rules -------------------------------------------------------------
install(TARGETS fsdpcheck EXPORT fsdpcheckTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# shrinks a sweep case that hangs, one job per variant (beside fsdpcheck, which it runs)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/fsdpcheck-shrink-timeout DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS fsdpcheck_core fsdpcheck_core_static fsdpcheck_reference fsdpcheck_reference_static
        EXPORT fsdpcheckTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${_fc_public_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/fsdpcheck)
# The CUDA port (optimized/, built where nvcc is): a plugin like any port,
# found by `--impl cuda` at <bindir>/../lib/fsdpcheck/libfsdpcheck_cuda.so
# (oracle/runner.c find_cuda_port; a literal lib/, not the multiarch libdir).
# Deferred to the end of the top-level directory: optimized/ may be added
# after this file. Its RUNPATH reaches libfsdpcheck_core in the libdir.
function(_fsdpcheck_install_cuda_port)
  if(TARGET fsdpcheck_cuda)
    get_target_property(rpath fsdpcheck_cuda INSTALL_RPATH)
    if(NOT rpath)
      file(RELATIVE_PATH rel ${CMAKE_INSTALL_PREFIX}/lib/fsdpcheck ${CMAKE_INSTALL_FULL_LIBDIR})
      string(REGEX REPLACE "/$" "" rel "${rel}")
      set_target_properties(fsdpcheck_cuda PROPERTIES INSTALL_RPATH "$ORIGIN/${rel}")
    endif()
    install(TARGETS fsdpcheck_cuda LIBRARY DESTINATION lib/fsdpcheck)
  endif()
endfunction()
cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL _fsdpcheck_install_cuda_port)

install(EXPORT fsdpcheckTargets NAMESPACE fsdpcheck:: DESTINATION ${FSDPCHECK_INSTALL_CMAKEDIR}
        FILE fsdpcheckTargets.cmake)
configure_package_config_file(${FSDPCHECK_CMAKE_DIR}/fsdpcheckConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/fsdpcheckConfig.cmake INSTALL_DESTINATION ${FSDPCHECK_INSTALL_CMAKEDIR})
# 0.x: only the same minor version is compatible (0.2.* satisfies 0.2)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/fsdpcheckConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/fsdpcheckConfig.cmake ${PROJECT_BINARY_DIR}/cmake/fsdpcheckConfigVersion.cmake
              ${FSDPCHECK_CMAKE_DIR}/FsdpcheckGate.cmake ${FSDPCHECK_CMAKE_DIR}/FsdpcheckExpectCaught.cmake
        DESTINATION ${FSDPCHECK_INSTALL_CMAKEDIR})

# pkg-config: relocatable (prefix from ${pcfiledir}), so a package unpacked
# into a scratch root works as well as one installed in /usr.
file(RELATIVE_PATH FSDPCHECK_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" FSDPCHECK_PC_TO_PREFIX "${FSDPCHECK_PC_TO_PREFIX}")
# the MPI this build uses, by its pkg-config name (MPICH on Debian 12)
if(MPI_C_LIB_NAMES MATCHES "mpich" OR MPI_C_HEADER_DIR MATCHES "mpich")
  set(FSDPCHECK_PC_MPI mpich)
elseif(MPI_C_LIB_NAMES MATCHES "mpi" AND MPI_C_HEADER_DIR MATCHES "openmpi")
  set(FSDPCHECK_PC_MPI ompi-c)
else()
  set(FSDPCHECK_PC_MPI "")
  message(STATUS "fsdpcheck: fsdpcheck.pc names no MPI package (not MPICH or Open MPI)")
endif()
foreach(pc fsdpcheck fsdpcheck-reference)
  configure_file(${FSDPCHECK_CMAKE_DIR}/${pc}.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()

# the port template, for a team that has only the package
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/plugin/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples/plugin)
# the contract and the guides the template cites (docs/contract.md §8, §9), beside it
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/CHANGELOG.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs FILES_MATCHING PATTERN "*.md" PATTERN "*.svg")

# ---- the tests of the package (labels mpi, unit) -----------------------------
add_subdirectory(${PROJECT_SOURCE_DIR}/tests/abi ${PROJECT_BINARY_DIR}/tests/abi)

# ---- cpack -G DEB: the Debian 12 package ------------------------------------
# Configure with -DCMAKE_INSTALL_PREFIX=/usr (ci/package.sh does) so the
# libraries go to the multiarch libdir. It carries the binary, the headers,
# the libraries, the CMake package and the pkg-config files: a -dev package,
# so it depends on the -dev packages find_dependency() needs, and on mpich
# for mpiexec.
set(CPACK_PACKAGE_NAME fsdpcheck)
set(CPACK_PACKAGE_VENDOR "fsdpcheck")
set(CPACK_PACKAGE_CONTACT "fsdpcheck maintainers <fsdpcheck@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "proves an FSDP implementation computes the right training")
set(CPACK_PACKAGE_DESCRIPTION
    "fsdpcheck checks a Fully Sharded Data Parallel implementation against a simple reference: the fsdpcheck CLI, the implementation contract headers, the core and reference libraries, the CMake package with fsdpcheck_add_gate() and pkg-config files, for hardware ports that gate their CI on it.")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "mpich, libmpich-dev, libcjson-dev, libssl-dev")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "cmake (>= 3.25), pkg-config")
# (dpkg-shlibdeps is dpkg-dev's; CPack also needs `file` for it)
find_program(FSDPCHECK_DPKG_SHLIBDEPS dpkg-shlibdeps)
find_program(FSDPCHECK_FILE file)
if(FSDPCHECK_DPKG_SHLIBDEPS AND FSDPCHECK_FILE)
  # adds libc6, libmpich12, libcjson1, libssl3 with their versions; our own
  # libfsdpcheck_core is resolved inside the package
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR})
endif()
set(CPACK_SOURCE_IGNORE_FILES "/build/;/\\\\.git/")
include(CPack)
