"""Environments and reward functions: math, arithmetic, countdown, sandboxed code, tools, sliding puzzle, reward models."""

__version__ = "0.1.0"

from rl_environments.arithmetic import ArithmeticDatasetConfig, ArithmeticEnvironment, arithmetic_split
from rl_environments.code_env import CodeEnvironment
from rl_environments.config import DatasetConfig, EnvConfig, FileDatasetConfig, ToolsDatasetConfig
from rl_environments.countdown import CountdownDatasetConfig, CountdownEnvironment, countdown_split
from rl_environments.dataset_base import PromptDatasetConfig
from rl_environments.datasets import load_prompt_file, record_to_sample
from rl_environments.math_env import MathEnvironment
from rl_environments.registry import build_environment, list_environments, register_environment
from rl_environments.reward_function import RewardFunctionEnvironment, reward_function_environment
from rl_environments.reward_model import RewardModelEnvironment
from rl_environments.sliding_puzzle import SlidingPuzzleDatasetConfig, SlidingPuzzleEnvironment, sliding_puzzle_split
from rl_environments.tools import ToolsEnvironment, parse_tool_calls, tools_split

__all__ = [
    "ArithmeticDatasetConfig", "ArithmeticEnvironment", "CodeEnvironment", "CountdownDatasetConfig",
    "CountdownEnvironment", "DatasetConfig", "EnvConfig", "FileDatasetConfig", "MathEnvironment",
    "PromptDatasetConfig", "RewardFunctionEnvironment", "RewardModelEnvironment", "SlidingPuzzleDatasetConfig",
    "SlidingPuzzleEnvironment", "ToolsDatasetConfig", "ToolsEnvironment", "arithmetic_split", "build_environment",
    "countdown_split", "list_environments", "load_prompt_file", "parse_tool_calls", "record_to_sample",
    "register_environment", "reward_function_environment", "sliding_puzzle_split", "tools_split",
]
