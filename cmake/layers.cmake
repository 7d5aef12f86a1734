# SPDX-License-Identifier: Apache-2.0
# The layers of src/ (docs/DESIGN.md §1), lowest first, and the one table that says what each may
# include. A layer's sources are compiled against an include view of their own,
# <build>/layers/<layer>/, which holds links to its own src/<layer>/ folder, to the folders of the
# layers it sits on and to their public headers (include/protokv/) only: an upward include is a
# "No such file" error at compile time, not a review comment. The CLI, the Python module, the
# tests and the fuzz targets sit above every layer and see all of src/.

set(PROTOKV_LAYERS core io kernels tokenizer cache press model eval server)
# What each layer sits on; LAYER:api = through LAYER's public headers (include/protokv/) only.
# The model runs a press through its interface (protokv/press.h, made from a PressSpec) and never
# names a concrete one; a press never calls the model; the server is built on the public API as
# an outside project would be.
set(PROTOKV_LAYER_USES_core "")
set(PROTOKV_LAYER_USES_io core)
set(PROTOKV_LAYER_USES_kernels core)
set(PROTOKV_LAYER_USES_tokenizer core io)
set(PROTOKV_LAYER_USES_cache core kernels)
set(PROTOKV_LAYER_USES_press core kernels cache)
set(PROTOKV_LAYER_USES_model core io kernels tokenizer cache press:api)
set(PROTOKV_LAYER_USES_eval core io kernels tokenizer cache press model)
set(PROTOKV_LAYER_USES_server core:api io:api kernels:api tokenizer:api cache:api press:api
                              model:api)
# Each public header (or folder of them) of include/protokv/ by the layer that implements it.
set(PROTOKV_PUBLIC_core dtype.h error.h json_keys.h limits.h memory.h tensor.h threads.h timer.h)
set(PROTOKV_PUBLIC_io gguf.h)
set(PROTOKV_PUBLIC_kernels key_segment.h)
set(PROTOKV_PUBLIC_tokenizer tokenizer.h)
set(PROTOKV_PUBLIC_cache kv_cache.h)
set(PROTOKV_PUBLIC_press press.h press_spec.h press_registry.h press)
set(PROTOKV_PUBLIC_model model.h engine.h generate.h sampler.h)
set(PROTOKV_PUBLIC_eval "")
set(PROTOKV_PUBLIC_server "")

# Every public header has a layer and every folder of src/ is a layer (or the CLI above them).
file(GLOB protokv_public RELATIVE ${PROJECT_SOURCE_DIR}/include/protokv
     ${PROJECT_SOURCE_DIR}/include/protokv/*)
foreach(entry ${protokv_public})
  set(owners "")
  foreach(layer ${PROTOKV_LAYERS})
    if(entry IN_LIST PROTOKV_PUBLIC_${layer})
      list(APPEND owners ${layer})
    endif()
  endforeach()
  list(LENGTH owners n_owners)
  if(NOT n_owners EQUAL 1)
    message(FATAL_ERROR "include/protokv/${entry} needs exactly one layer in cmake/layers.cmake "
                        "(PROTOKV_PUBLIC_<layer>), has: '${owners}'")
  endif()
endforeach()
file(GLOB protokv_src_folders LIST_DIRECTORIES true RELATIVE ${PROJECT_SOURCE_DIR}/src
     ${PROJECT_SOURCE_DIR}/src/*)
foreach(folder ${protokv_src_folders})
  if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/src/${folder} AND NOT folder STREQUAL "cli"
     AND NOT folder IN_LIST PROTOKV_LAYERS)
    message(FATAL_ERROR "src/${folder}/ is not a layer: add it to PROTOKV_LAYERS in "
                        "cmake/layers.cmake with the layers it sits on")
  endif()
endforeach()

# Makes <build>/layers/<layer>/ (remade at every configure) and sets <out_var> to it.
function(protokv_layer_view layer out_var)
  set(view ${PROJECT_BINARY_DIR}/layers/${layer})
  file(REMOVE_RECURSE ${view})
  file(MAKE_DIRECTORY ${view}/protokv)
  foreach(entry ${PROTOKV_LAYER_USES_${layer}} ${layer})
    string(REPLACE ":api" "" used ${entry})
    if(NOT used IN_LIST PROTOKV_LAYERS)
      message(FATAL_ERROR "cmake/layers.cmake: ${layer} uses ${used}, which is not a layer")
    endif()
    if(entry STREQUAL used)  # the whole layer, not only its public headers
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${used} ${view}/${used} SYMBOLIC)
    endif()
    foreach(header ${PROTOKV_PUBLIC_${used}})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/protokv/${header} ${view}/protokv/${header}
           SYMBOLIC)
    endforeach()
  endforeach()
  set(${out_var} ${view} PARENT_SCOPE)
endfunction()

foreach(layer ${PROTOKV_LAYERS})
  protokv_layer_view(${layer} PROTOKV_VIEW_${layer})
endforeach()
