import random

import art
from game import apply_move, new_game, opponent_move, render, system_prompt, winner
from pydantic import BaseModel


class TicTacToeScenario(BaseModel):
    step: int
    split: str = "train"


async def rollout(model: art.Model, scenario: TicTacToeScenario) -> art.Trajectory:
    game = new_game(random.Random())
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "system", "content": system_prompt(game["agent_symbol"])}],
        reward=0,
        metadata={"step": scenario.step, "split": scenario.split},
    )
    if game["agent_symbol"] == "o":
        opponent_move(game)
    client = model.openai_client()
    valid_moves = 0
    while winner(game) is None:
        trajectory.messages_and_choices.append({"role": "user", "content": render(game)})
        completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=32
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        try:
            apply_move(game, choice.message.content or "")
        except ValueError:
            # Losing by an invalid move, later is better than sooner.
            trajectory.reward = -1 + 0.1 * valid_moves
            trajectory.metrics["invalid_move"] = 1
            return trajectory.finish()
        valid_moves += 1
        if winner(game) is None:
            opponent_move(game)
    result = winner(game)
    trajectory.metrics["invalid_move"] = 0
    trajectory.reward = 1 if result == game["agent_symbol"] else 0.5 if result == "draw" else 0
    return trajectory.finish()
