-- slurm-elastic job_submit plugin (Lua 5.1, Debian's job_submit_lua.so).
function slurm_job_submit(job_desc, part_list, submit_uid)
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
