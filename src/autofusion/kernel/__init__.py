"""The loop-kernel layer: fused groups lowered to loop kernels (`lower`), their index maps (`index`)
and tiles (`tile`)."""
