"""Models: the HF target wrapper, the DFlash-style drafter, correction heads, loaders, the zoo."""

from dartree.models import zoo
from dartree.models.drafter import DFlashConfig, DFlashDrafter, dflash_target_layer_ids
from dartree.models.heads import GRUHead, MarkovHead
from dartree.models.loaders import load_drafter, load_head, save_drafter, save_gru_head, save_markov_head
from dartree.models.target import HFTarget

__all__ = ["DFlashConfig", "DFlashDrafter", "GRUHead", "HFTarget", "MarkovHead", "dflash_target_layer_ids",
           "load_drafter", "load_head", "save_drafter", "save_gru_head", "save_markov_head", "zoo"]
