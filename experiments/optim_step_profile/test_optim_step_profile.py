"""CPU checks of the profile summary (the scripts themselves need CUDA)."""

from experiments.optim_step_profile.profile_step import family


def test_kernel_families() -> None:
    assert family("momentum_pack_t_kernel") == "momentum_pack"
    assert family("apply_update_kernel") == "apply_update"
    assert family("kernel_cutlass_kernel_quackgemm_symmetricGemmSymmetricSm90_o") == "sym"
    assert family("kernel_cutlass_kernel_quackgemm_default_epiGemmDefaultSm90_o") == "gemm"
    assert family("some_other_kernel_with_a_long_name" * 3) == ("some_other_kernel_with_a_long_name" * 3)[:60]
