# cmake -P build_jar.cmake: compiles the SWIG-generated and the hand-written
# Java sources into a jar, or (with TEST_JAR) the test sources against it.
# Globs at build time: SWIG's file list follows the header.
# Variables: JAVAC, JAR, OUT_JAR, CLASSES_DIR, SOURCE_DIRS (;-list),
# CLASSPATH (;-list, optional), STAMP (touched on success).
file(REMOVE_RECURSE "${CLASSES_DIR}")
file(MAKE_DIRECTORY "${CLASSES_DIR}")
set(_srcs)
foreach(_d IN LISTS SOURCE_DIRS)
  file(GLOB_RECURSE _s "${_d}/*.java")
  list(APPEND _srcs ${_s})
endforeach()
if(NOT _srcs)
  message(FATAL_ERROR "no Java sources in ${SOURCE_DIRS}")
endif()
list(SORT _srcs)
set(_cp)
if(CLASSPATH)
  string(REPLACE ";" ":" _cp_str "${CLASSPATH}")
  set(_cp -classpath "${_cp_str}")
endif()
execute_process(
  COMMAND "${JAVAC}" --release 11 -encoding UTF-8 -Xlint:all -Werror -d "${CLASSES_DIR}" ${_cp} ${_srcs}
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "javac failed (${_rc})")
endif()
execute_process(COMMAND "${JAR}" --create --file "${OUT_JAR}" -C "${CLASSES_DIR}" . RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "jar failed (${_rc})")
endif()
