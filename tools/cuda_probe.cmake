# tm_cuda_probe(NAME SOURCE): a development probe of the CUDA backend, built with it (sm_90a, and
# PTX for other GPUs; warnings as errors under TM_WERROR), linked with the CUDA runtime only.
function(tm_cuda_probe name source)
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE CUDA::cudart)
  set_target_properties(${name} PROPERTIES CUDA_ARCHITECTURES OFF CUDA_STANDARD 17)
  target_compile_options(${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${TM_WERROR}>>:-Werror=all-warnings>)
endfunction()
