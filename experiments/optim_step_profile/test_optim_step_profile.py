"""CPU checks of the profile summary (the scripts themselves need CUDA)."""

from experiments.optim_step_profile.profile_step import family


def test_kernel_families() -> None:
    assert family("momentum_pack_t_kernel") == "momentum_pack"
    assert family("apply_update_kernel") == "apply_update"
    assert family("kernel_cutlass_kernel_quackgemm_symmetricGemmSymmetricSm90_o") == "sym"
    assert family("kernel_cutlass_kernel_quackgemm_default_epiGemmDefaultSm90_o") == "gemm"
    assert family("some_other_kernel_with_a_long_name" * 3) == ("some_other_kernel_with_a_long_name" * 3)[:60]


def test_interleaved_rejects_unknown_variants() -> None:
    import pytest

    from experiments.optim_step_profile.interleaved import main

    with pytest.raises(ValueError, match="variants"):
        main(["variants=optim_muon,fast"])
